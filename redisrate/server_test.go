//go:build unix

package redisrate

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// redisServer is a redis-server from PATH that a test starts on a free
// loopback port, with a temporary directory and no persistence, and that
// is killed when the test ends (and, on Linux, when the test binary dies).
// Its methods are for the test's goroutine.
type redisServer struct {
	t       testing.TB
	addr    string
	dir     string
	args    []string // extra configuration
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has been waited for
	stopped bool          // by SIGSTOP
}

// startRedis starts a server for t, with extra configuration args
// ("--cluster-enabled", "yes", ...).
func startRedis(t testing.TB, args ...string) *redisServer {
	t.Helper()
	need(t, "redis-server")
	s := &redisServer{t: t, dir: t.TempDir(), args: args}
	t.Cleanup(s.kill)
	// A port found free may be taken before the server binds it: try
	// another one then.
	var err error
	for range 5 {
		s.addr = freeAddr(t)
		if err = s.start(); err == nil {
			return s
		}
	}
	t.Fatalf("redis-server did not start: %v", err)
	return nil
}

// need skips t where the named binary of Debian's redis-server package
// (redis-server, redis-cli) is not in PATH, and fails it instead when
// CI=true: CI installs the package (.ci/run). The tests of
// examples/prometheus follow the same rule.
func need(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		msg := fmt.Sprintf("%s is not in PATH: install Redis (Debian: apt-get install redis-server) to run this test", name)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// timing reports whether the tests check how long things take and the
// rates they reach (RESILIX_REDIS_TIMING=1, make redis): figures that the
// scheduler of a busy machine moves, and the race detector's slowdown of
// every call. Without it they log those figures and check what holds on
// any machine: counts, the order of the transitions, the limits never
// exceeded.
func timing() bool { return os.Getenv("RESILIX_REDIS_TIMING") == "1" }

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start runs the server on s.addr and returns once it answers PING.
func (s *redisServer) start() error {
	_, port, _ := net.SplitHostPort(s.addr)
	args := append([]string{
		"--port", port, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"),
	}, s.args...)
	cmd := exec.Command("redis-server", args...)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := ping(s.addr); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("no PONG within 10s: %v; log:\n%s", err, s.log())
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited at start; log:\n%s", s.log())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// restart starts the server again on the same address, with no data.
func (s *redisServer) restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// kill ends the server with SIGKILL, as a crash would, and waits for it.
func (s *redisServer) kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd, s.stopped = nil, false
}

// freeze stops the server with SIGSTOP: connections stay open and
// commands go unanswered, as on a host that hangs. thaw resumes it.
func (s *redisServer) freeze() { s.signal(syscall.SIGSTOP); s.stopped = true }
func (s *redisServer) thaw()   { s.signal(syscall.SIGCONT); s.stopped = false }

func (s *redisServer) signal(sig os.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatal(err)
	}
}

func (s *redisServer) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}

// ping sends PING on a connection of its own.
func ping(addr string) error {
	return command(addr, "PING", "+PONG")
}

// command sends one inline command on a connection of its own and checks
// that the reply starts with want.
func command(addr, cmd, want string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "%s\r\n", cmd); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, want) {
		return fmt.Errorf("%s: %q, want %q", cmd, strings.TrimSpace(line), want)
	}
	return nil
}

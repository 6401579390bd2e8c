package fleetops

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	crand "crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serviceName is the name the clients call, known only to the fleet's
// dnsmasq.
const serviceName = "svc.fleet.test"

// readyName is always in the fleet's DNS, so that the harness can tell
// when dnsmasq answers.
const readyName = "ready.fleet.test"

const echoModule = "/usr/lib/nginx/modules/ngx_http_echo_module.so"

// tools finds nginx, dnsmasq and (when haproxy is true) haproxy, installs
// what is missing with apt-get when running as root, and skips the test
// with what is missing otherwise.
func tools(t *testing.T, haproxy bool) (nginx, dnsmasq string) {
	t.Helper()
	find := func() (missing []string) {
		nginx, dnsmasq = lookPath("nginx"), lookPath("dnsmasq")
		if nginx == "" {
			missing = append(missing, "nginx-light")
		}
		if _, err := os.Stat(echoModule); err != nil {
			missing = append(missing, "libnginx-mod-http-echo")
		}
		if dnsmasq == "" {
			missing = append(missing, "dnsmasq")
		}
		if haproxy && lookPath("haproxy") == "" {
			missing = append(missing, "haproxy")
		}
		return missing
	}
	missing := find()
	if len(missing) == 0 {
		return nginx, dnsmasq
	}
	if os.Geteuid() != 0 || lookPath("apt-get") == "" {
		t.Skipf("fleetops needs %s (Debian's packages; as root the harness installs them with apt-get)", strings.Join(missing, ", "))
	}
	install := func(args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "apt-get", args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	t.Logf("installing %s with apt-get", strings.Join(missing, ", "))
	args := append([]string{"install", "-y", "--no-install-recommends"}, missing...)
	if err := install(args...); err != nil {
		if err := install("update"); err != nil {
			t.Skipf("fleetops needs %s: %v", strings.Join(missing, ", "), err)
		}
		if err := install(args...); err != nil {
			t.Skipf("fleetops needs %s: %v", strings.Join(missing, ", "), err)
		}
	}
	if missing := find(); len(missing) > 0 {
		t.Skipf("fleetops needs %s, still missing after apt-get", strings.Join(missing, ", "))
	}
	return nginx, dnsmasq
}

// lookPath finds a program in PATH or in /usr/sbin (not in every user's
// PATH), "" if neither has it.
func lookPath(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join("/usr/sbin", name); fileExists(p) {
		return p
	}
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// A proc is a process the harness started, in a process group of its
// own, so that a signal reaches its children too (nginx's workers).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it exited
}

// startProc starts cmd in a process group of its own, its output to
// logPath; the test's cleanup kills the group if it is still there.
func startProc(t *testing.T, name, logPath string, cmd *exec.Cmd) *proc {
	t.Helper()
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("%s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		out.Close()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	return p
}

// signal sends sig to the process's group.
func (p *proc) signal(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill kills the process's group (thawed first, in case it was stopped)
// and waits for the process, at most 5 s.
func (p *proc) kill() {
	if p.exited() {
		// A group's other members (nginx's workers) may outlive the
		// master killed alone; the group's kill reaches them.
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return
	}
	p.signal(syscall.SIGKILL)
	p.signal(syscall.SIGCONT)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

// wait waits for the process to exit, at most d; false if it did not.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// A fleet is the replicas of one run and the DNS server that names them.
type fleet struct {
	t              *testing.T
	dir            string
	nginx, dnsmasq string
	port           int
	dnsAddr        string
	dns            *proc
	mu             sync.Mutex // guards replicas' procs
	replicas       []*replica
	resolver       *net.Resolver
	// cert and key are the PEM files of the replicas' certificate (for
	// serviceName, its own root) when the fleet speaks HTTP/2 over TLS;
	// "" for HTTP/1.1 in the clear.
	cert, key string
}

// A replica is one nginx, on its own loopback address.
type replica struct {
	ip    string
	dir   string
	delay time.Duration
	proc  *proc
}

// newFleet makes n replicas' configs (on 127.0.0.2 and up), speaking
// HTTP/2 over TLS when h2 is true, and starts dnsmasq naming none of them
// yet.
func newFleet(t *testing.T, nginx, dnsmasq string, n int, h2 bool) *fleet {
	t.Helper()
	dir := t.TempDir()
	if keep := os.Getenv("FLEETOPS_KEEP"); keep != "" {
		var err error
		if dir, err = os.MkdirTemp(keep, "run-"); err != nil {
			t.Fatalf("FLEETOPS_KEEP=%s: %v", keep, err)
		}
		t.Logf("FLEETOPS_KEEP: this run's configs, logs and clients' records are kept in %s", dir)
	}
	f := &fleet{t: t, dir: dir, nginx: nginx, dnsmasq: dnsmasq}
	if h2 {
		f.cert, f.key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
		if err := writeCert(f.cert, f.key); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		ip := netip.AddrFrom4([4]byte{127, 0, 0, byte(2 + i)}).String()
		f.replicas = append(f.replicas, &replica{ip: ip, dir: filepath.Join(dir, "replica-"+ip), delay: 5 * time.Millisecond})
	}
	f.port = freePort(t, f.ips(f.replicas...)...)
	f.dnsAddr = "127.0.0.1:" + strconv.Itoa(freePort(t, "127.0.0.1"))
	f.resolver = resolverTo(f.dnsAddr)
	if err := f.writeHosts(nil); err != nil {
		t.Fatal(err)
	}
	f.dns = startProc(t, "dnsmasq", filepath.Join(dir, "dnsmasq.log"), exec.Command(dnsmasq,
		"--keep-in-foreground", "--conf-file=/dev/null", "--pid-file=",
		"--port="+strings.TrimPrefix(f.dnsAddr, "127.0.0.1:"), "--listen-address=127.0.0.1", "--bind-interfaces",
		"--no-resolv", "--no-hosts", "--addn-hosts="+filepath.Join(dir, "hosts"), "--local-ttl=1",
		"--user=root", "--log-facility=-"))
	if err := waitFor(5*time.Second, func() bool {
		_, err := f.resolver.LookupHost(context.Background(), readyName)
		return err == nil
	}); err != nil {
		t.Fatalf("dnsmasq on %s never answered: %v", f.dnsAddr, err)
	}
	return f
}

func (f *fleet) ips(rs ...*replica) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ip)
	}
	return out
}

func (f *fleet) url() string {
	scheme := "http://"
	if f.cert != "" {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(serviceName, strconv.Itoa(f.port)) + "/"
}

// writeCert writes a self-signed certificate for serviceName, valid for a
// day, and its key, as PEM files.
func writeCert(certPath, keyPath string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), crand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: serviceName},
		DNSNames:              []string{serviceName},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(crand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
}

// freePort returns a port free for TCP (and UDP) on every one of ips,
// below Linux's ephemeral ports (32768 and up), so that no connection's
// own end takes it while a replica restarts.
func freePort(t *testing.T, ips ...string) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		ok := true
		var held []interface{ Close() error }
		for _, ip := range ips {
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			l, err := net.Listen("tcp", addr)
			if err != nil {
				ok = false
				break
			}
			held = append(held, l)
			u, err := net.ListenPacket("udp", addr)
			if err != nil {
				ok = false
				break
			}
			held = append(held, u)
		}
		for _, h := range held {
			h.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatalf("no port free on %v", ips)
	return 0
}

// writeHosts makes dnsmasq's hosts file name rs, atomically.
func (f *fleet) writeHosts(rs []*replica) error {
	var b strings.Builder
	fmt.Fprintf(&b, "127.0.0.1 %s\n", readyName)
	for _, r := range rs {
		fmt.Fprintf(&b, "%s %s\n", r.ip, serviceName)
	}
	tmp := filepath.Join(f.dir, "hosts.new")
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(f.dir, "hosts"))
}

// name makes the service name rs in DNS (SIGHUP re-reads the hosts file
// and empties dnsmasq's cache) and waits until dnsmasq answers so.
func (f *fleet) name(rs ...*replica) time.Time {
	f.t.Helper()
	if err := f.writeHosts(rs); err != nil {
		f.t.Fatal(err)
	}
	if err := f.dns.signal(syscall.SIGHUP); err != nil {
		f.t.Fatal(err)
	}
	at := time.Now()
	want := f.ips(rs...)
	slices.Sort(want)
	if err := waitFor(3*time.Second, func() bool {
		got, _ := f.resolver.LookupHost(context.Background(), serviceName)
		slices.Sort(got)
		return slices.Equal(got, want)
	}); err != nil {
		f.t.Fatalf("dnsmasq never named %v", want)
	}
	return at
}

// nginxConf is a replica's config: one worker, the fleet log format (see
// accessLine), X-Replica on every answer, and every request (GET or
// POST, its body read) answered "ok" after the replica's delay; over TLS
// with HTTP/2 when cert is not "".
func nginxConf(r *replica, port int, cert, key string) string {
	listen := fmt.Sprintf("listen %s:%d;", r.ip, port)
	if cert != "" {
		listen = fmt.Sprintf("listen %s:%d ssl http2;\n\t\tssl_certificate %s;\n\t\tssl_certificate_key %s;", r.ip, port, cert, key)
	}
	return fmt.Sprintf(`load_module %s;
daemon off;
worker_processes 1;
pid nginx.pid;
error_log error.log warn;
events { worker_connections 4096; }
http {
	log_format fleet '$msec $server_addr $request_method $status $request_time "$http_x_fleet_id" "$http_idempotency_key"';
	access_log access.log fleet;
	client_body_temp_path tmp_body;
	proxy_temp_path tmp_proxy;
	fastcgi_temp_path tmp_fastcgi;
	uwsgi_temp_path tmp_uwsgi;
	scgi_temp_path tmp_scgi;
	keepalive_requests 100000;
	server {
		%s
		location / {
			add_header X-Replica $server_addr always;
			echo_read_request_body;
			echo_sleep %.3f;
			echo ok;
		}
	}
}
`, echoModule, listen, r.delay.Seconds())
}

// start starts the replica's nginx and returns when it accepts
// connections.
func (f *fleet) start(r *replica) time.Time {
	f.t.Helper()
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "nginx.conf"), []byte(nginxConf(r, f.port, f.cert, f.key)), 0o644); err != nil {
		f.t.Fatal(err)
	}
	p := startProc(f.t, "nginx "+r.ip, filepath.Join(r.dir, "stderr.log"),
		exec.Command(f.nginx, "-p", r.dir+"/", "-c", "nginx.conf", "-e", "error.log"))
	f.mu.Lock()
	r.proc = p
	f.mu.Unlock()
	addr := net.JoinHostPort(r.ip, strconv.Itoa(f.port))
	var at time.Time
	if err := waitFor(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return p.exited()
		}
		at = time.Now()
		c.Close()
		return true
	}); err != nil || at.IsZero() {
		errLog, _ := os.ReadFile(filepath.Join(r.dir, "error.log"))
		f.t.Fatalf("nginx on %s never listened: %s", addr, errLog)
	}
	return at
}

// stop stops the replica gracefully (SIGQUIT: nginx closes its listener
// and idle keep-alive connections, finishes its requests and exits) and
// waits for it, at most 10 s before it is killed. It may be called from
// any goroutine.
func (f *fleet) stop(r *replica) {
	f.t.Helper()
	if err := r.proc.signal(syscall.SIGQUIT); err != nil {
		f.t.Errorf("SIGQUIT to nginx %s: %v", r.ip, err)
		return
	}
	if !r.proc.wait(10 * time.Second) {
		f.t.Logf("nginx %s still running 10s after SIGQUIT: killed", r.ip)
		r.proc.kill()
	}
}

// accessLog reads every replica's access log (one file across restarts).
func (f *fleet) accessLog() ([]accessLine, error) {
	var out []accessLine
	for _, r := range f.replicas {
		b, err := os.ReadFile(filepath.Join(r.dir, "access.log"))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for line := range strings.Lines(string(b)) {
			if strings.TrimSpace(line) == "" {
				continue
			}
			l, err := parseAccessLine(line)
			if err != nil {
				return nil, err
			}
			out = append(out, l)
		}
	}
	return out, nil
}

// A client is a client process of the harness.
type client struct {
	role string
	out  string
	proc *proc
}

// startClient re-executes the test binary as a client of role (see
// TestMain), calling from start for length.
func (f *fleet) startClient(role string, run int, start time.Time, length time.Duration) *client {
	f.t.Helper()
	c := &client{role: role, out: filepath.Join(f.dir, role+".jsonl")}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		"FLEETOPS_ROLE="+role,
		"FLEETOPS_DNS="+f.dnsAddr,
		"FLEETOPS_URL="+f.url(),
		"FLEETOPS_KEY="+net.JoinHostPort(serviceName, strconv.Itoa(f.port)),
		"FLEETOPS_START="+strconv.FormatInt(start.UnixNano(), 10),
		"FLEETOPS_LENGTH="+length.String(),
		"FLEETOPS_OUT="+c.out,
		"FLEETOPS_SEED="+strconv.Itoa(run+1),
		"FLEETOPS_ID="+role[:1]+strconv.Itoa(run),
		"FLEETOPS_CA="+f.cert,
	)
	c.proc = startProc(f.t, role, filepath.Join(f.dir, role+".log"), cmd)
	return c
}

// records waits for the client to exit (at most d) and reads its records.
func (c *client) records(t *testing.T, d time.Duration) []record {
	t.Helper()
	if !c.proc.wait(d) {
		c.proc.kill()
		t.Fatalf("client %s still running after %v: killed", c.role, d)
	}
	if err := c.proc.cmd.ProcessState.ExitCode(); err != 0 {
		out, _ := os.ReadFile(strings.TrimSuffix(c.out, ".jsonl") + ".log")
		t.Fatalf("client %s exited %d: %s", c.role, err, out)
	}
	recs, err := readRecordsFile(c.out)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// conns counts the client's open TCP connections to each of ips.
func (c *client) conns(ips []string) (map[netip.Addr]int, error) {
	pid := c.proc.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	tcp, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return nil, err
	}
	to := map[netip.Addr]bool{}
	for _, ip := range ips {
		to[netip.MustParseAddr(ip)] = true
	}
	return openConns(string(tcp), inodes, to), nil
}

// waitFor polls cond every 20 ms until it holds, at most d.
func waitFor(d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

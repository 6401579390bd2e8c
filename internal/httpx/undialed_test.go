package httpx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"testing"
)

func TestUndialed(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tt := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused", refused, true},
		{"refused, in a url.Error", &url.Error{Op: "Get", URL: "http://a/", Err: refused}, true},
		{"a dial timeout", fmt.Errorf("wrapped: %w", &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}), true},
		{"a reset after the write", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{"a proxy not reached", &net.OpError{Op: "proxyconnect", Net: "tcp", Err: syscall.ECONNREFUSED}, false},
		{"nil", nil, false},
		{"another error", errors.New("boom"), false},
	} {
		if got := Undialed(tt.err); got != tt.want {
			t.Errorf("%s: Undialed = %v, want %v", tt.name, got, tt.want)
		}
	}
}

package s3

import "testing"

// A gateway beside ferry is one at a loopback address, written as an IP
// or as localhost; AWS, a name (not resolved) and anything else are not.
func TestLoopback(t *testing.T) {
	for _, c := range []struct {
		endpoint string
		want     bool
	}{
		{"http://127.0.0.1:7070", true},
		{"http://127.3.2.1", true},
		{"http://[::1]:9000", true},
		{"https://LOCALHOST:9000/", true},
		{"http://localhost", true},
		{"AWS S3", false},
		{"https://s3.us-east-1.amazonaws.com", false},
		{"http://10.0.0.5:9000", false},
		{"http://minio.lan:9000", false},
		{"http://[::2]:9000", false},
		{"http://0.0.0.0:9000", false},
		{"", false},
		{"://bad", false},
	} {
		if got := loopback(c.endpoint); got != c.want {
			t.Errorf("loopback(%q) = %v, want %v", c.endpoint, got, c.want)
		}
	}
}

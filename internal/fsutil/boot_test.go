package fsutil

import (
	"runtime"
	"strings"
	"testing"
)

func TestBootID(t *testing.T) {
	a, b := BootID(), BootID()
	if a == "" || a != b {
		t.Fatalf("BootID() = %q then %q: want one non-empty value", a, b)
	}
	if runtime.GOOS == "linux" && !strings.HasPrefix(a, "boot ") {
		t.Errorf("BootID() = %q on Linux: want the kernel's boot id", a)
	}
}

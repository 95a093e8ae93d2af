package sysmem

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// On Linux the figure agrees with /proc/meminfo's MemTotal.
func TestTotal(t *testing.T) {
	got := Total()
	if runtime.GOOS != "linux" {
		if (runtime.GOOS == "darwin") != (got > 0) {
			t.Errorf("Total() = %d on %s", got, runtime.GOOS)
		}
		return
	}
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			if got != kb*1024 {
				t.Errorf("Total() = %d, /proc/meminfo says %d", got, kb*1024)
			}
			return
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
}

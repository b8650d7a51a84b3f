package helm

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain removes what the tests built once for all of them (the binaries, the
// certificates), and checks that nothing leaked a goroutine.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{binsOnce.dir, certsOnce.dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

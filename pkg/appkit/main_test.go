package appkit

import (
	"testing"

	"go.uber.org/goleak"
)

// Servers' goroutines, the signal goroutine and the etcd client must not outlive a test.
// net/http lingers 500 ms after answering 431 to a connection (closeWriteAndWait), past
// Server.Close: that goroutine ends on its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("net/http.(*conn).closeWriteAndWait"))
}

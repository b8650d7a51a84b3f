package app

import (
	"fmt"
	"runtime/debug"
)

// ApplyRuntime sets the Go runtime settings cfg asks for, for the whole process: the
// garbage collector's target (Config.GCPercent) unless the environment sets GOGC, which
// the Go runtime has read already and which wins. It returns what it did, for the log. A
// process's owner calls it once (cmd/enforcer); New does not, since it may run beside
// other code in one process.
func ApplyRuntime(cfg *Config, getenv func(string) string) string {
	if v := getenv("GOGC"); v != "" {
		return fmt.Sprintf("GOGC=%s from the environment (gc_percent %d not applied)", v, cfg.GCPercent)
	}
	debug.SetGCPercent(cfg.GCPercent)
	return fmt.Sprintf("gc_percent %d", cfg.GCPercent)
}

//go:build race

package sim

// raceEnabled: the race detector makes every check ~20× dearer; the longest shipped
// scenario (many-keys, 1.8 M checks, 20 s) is then run once, by
// TestManyKeysMovesFastAndQuiet, not again by TestShippedScenarios.
const raceEnabled = true

//go:build race

package sim

// raceEnabled: the race detector makes every check ~20× dearer; the longest shipped
// scenario (many-keys, 1.8 M checks) is then left to the run without -race.
const raceEnabled = true

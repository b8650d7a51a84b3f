//go:build race

package fallback_test

// raceEnabled: the race detector slows every Redis round trip several-fold.
const raceEnabled = true

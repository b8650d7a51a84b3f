//go:build !race

package fallback_test

const raceEnabled = false

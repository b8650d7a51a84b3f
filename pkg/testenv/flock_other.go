//go:build !unix

package testenv

// lockFile does not lock where flock is missing: concurrent builds are then possible but
// harmless (scripts/images.sh re-checks the tag), only slower.
func lockFile(path string) (unlock func(), err error) { return func() {}, nil }

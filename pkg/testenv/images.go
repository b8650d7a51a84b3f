package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/ory/dockertest/v3"
)

// buildTimeout bounds scripts/images.sh (debootstrap takes a few minutes on a fresh machine).
const buildTimeout = 20 * time.Minute

// buildBaseImage runs scripts/images.sh to build img, holding an exclusive lock file in
// os.TempDir() so that test binaries running at the same time build it once: the ones
// that wait find the image present when they get the lock.
func buildBaseImage(pool *dockertest.Pool, img string) error {
	unlock, err := lockFile(filepath.Join(os.TempDir(), "allot-testenv-images.lock"))
	if err != nil {
		return fmt.Errorf("while locking the image build: %w", err)
	}
	defer unlock()
	if _, err := pool.Client.InspectImage(img); err == nil {
		return nil // another test binary built it while we waited
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "images.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "ALLOT_BASE_IMAGE="+img)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("while building image %s with scripts/images.sh (run `make images` to see why): %w\n%s",
			img, err, out)
	}
	if _, err := pool.Client.InspectImage(img); err != nil {
		return fmt.Errorf("scripts/images.sh succeeded but image %s is still missing: %w", img, err)
	}
	return nil
}

// repoRoot finds the directory holding go.mod and scripts/images.sh: first from this
// source file's path, then from `go env GOMOD` run in the working directory.
func repoRoot() (string, error) {
	if _, file, _, ok := runtime.Caller(0); ok {
		for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
			if hasImagesScript(dir) {
				return dir, nil
			}
			if parent := filepath.Dir(dir); parent == dir {
				break
			}
		}
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err == nil {
		if dir := filepath.Dir(strings.TrimSpace(string(out))); hasImagesScript(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("cannot find the repository root (go.mod next to scripts/images.sh) to build the images; run `make images`")
}

func hasImagesScript(dir string) bool {
	_, err1 := os.Stat(filepath.Join(dir, "go.mod"))
	_, err2 := os.Stat(filepath.Join(dir, "scripts", "images.sh"))
	return err1 == nil && err2 == nil
}

package grpcapi

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/pkg/bucket"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
)

// TestAllotSources holds the one Source mapping to the wire names: every source that can
// decide a check is SOURCE_<its name>, and no two share a wire value.
func TestAllotSources(t *testing.T) {
	seen := map[allotv1.Source]bucket.Source{}
	for s := bucket.Source(0); s < bucket.NumSources; s++ {
		got := allotSource(s)
		if s == bucket.SourceShadow {
			if got != allotv1.Source_SOURCE_UNSPECIFIED {
				t.Errorf("allotSource(shadow) = %v, want SOURCE_UNSPECIFIED (a shadow rule never decides)", got)
			}
			continue
		}
		want := "SOURCE_" + strings.ToUpper(strings.ReplaceAll(s.String(), "-", "_"))
		if got.String() != want {
			t.Errorf("allotSource(%v) = %v, want %s", s, got, want)
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("allotSource(%v) = allotSource(%v) = %v", s, prev, got)
		}
		seen[got] = s
	}
	if got := allotSource(bucket.NumSources); got != allotv1.Source_SOURCE_UNSPECIFIED {
		t.Errorf("allotSource(past the last) = %v, want SOURCE_UNSPECIFIED", got)
	}
}

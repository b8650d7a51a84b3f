package sim

import (
	"testing"

	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// BenchmarkManyKeys runs the shipped 10-minute, three-region, 20-key scenario.
func BenchmarkManyKeys(b *testing.B) {
	sc, err := scenario.Load("../../configs/scenarios/many-keys.yaml")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := Run(sc, Options{Policy: PolicyBalancer}); err != nil {
			b.Fatal(err)
		}
	}
}

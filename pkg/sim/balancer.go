package sim

import (
	"fmt"

	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// newBalancerPlane is wired to pkg/balancer's Core once that lands on main.
func newBalancerPlane(sc *scenario.Scenario) (plane, error) {
	return nil, fmt.Errorf("%w %q: pkg/balancer is not merged yet", ErrPolicy, PolicyBalancer)
}

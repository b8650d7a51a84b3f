package rules_test

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/allot-dev/allot/pkg/rules"
)

func ExampleSnapshot_Match() {
	set, err := rules.ParseYAML([]byte(`
version: "2024-06-01"
rules:
  - id: default
    limits: [{name: second, rate: 10, per: 1s}]
  - id: pro
    match: {plan: pro}
    limits: [{name: second, rate: 100, per: 1s, burst: 200}, {name: minute, rate: 5000, per: 1m}]
    shares: {us-east: 0.5}
  - id: per-ip
    by: ip
    limits: [{name: minute, rate: 600, per: 1m}]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	snap, err := rules.Compile(set, rules.CompileOptions{Region: "us-east"})
	if err != nil {
		fmt.Println(err)
		return
	}
	h := rules.NewHolder(snap)

	a := &rules.Attrs{APIKey: "k1", Plan: "pro", IP: netip.MustParseAddr("2001:db8::7")}
	for _, m := range h.Current().Match(a, time.Now(), nil) {
		fmt.Println(m.Rule.ID, m.Identity, m.Cost)
		for _, l := range m.Rule.Limits {
			fmt.Printf("  %s rate=%g/s burst=%g\n", l.Name, l.Rate, l.Burst)
		}
	}
	// Output:
	// pro key:k1 1
	//   pro/second rate=50/s burst=100
	//   pro/minute rate=41.666666666666664/s burst=2500
	// per-ip ip6:2001:db8::/64 1
	//   per-ip/minute rate=10/s burst=600
}

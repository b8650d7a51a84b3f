package report_test

import (
	"fmt"
	"time"

	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/enforcer/report"
	"github.com/allot-dev/allot/pkg/rules"
)

// A table counts what the enforcer admitted and refused; Report drains one interval.
func ExampleTable() {
	start := time.Unix(1_700_000_000, 0)
	t, err := report.NewTable(report.DefaultConfig(), start)
	if err != nil {
		panic(err)
	}
	perKey := &rules.Compiled{ID: "default", Limits: []bucket.Limit{{Name: "per-second", Rate: 10, Burst: 20}}}
	t.ObserveTake(perKey, "key:k_1", 100, true, false, bucket.SourceRedis, start.Add(9*time.Second))
	t.ObserveTake(perKey, "key:k_1", 30, false, false, bucket.SourceRefusalCache, start.Add(9*time.Second))
	t.ObserveTake(perKey, "key:k_2", 5, true, false, bucket.SourceLease, start.Add(9*time.Second))

	r := t.Report(start.Add(10 * time.Second))
	for _, u := range r.Usage {
		fmt.Printf("%s %s admitted=%v refused=%v error=%v rate=%v\n", u.Rule, u.Identity, u.Admitted, u.Refused, u.Error, u.RegionalRate)
	}
	fmt.Println("interval ms:", r.IntervalEndMs-r.IntervalStartMs, "omitted:", r.OmittedIdentities)
	// Output:
	// default key:k_1 admitted=100 refused=30 error=0 rate=10
	// default key:k_2 admitted=5 refused=0 error=0 rate=10
	// interval ms: 10000 omitted: 0
}

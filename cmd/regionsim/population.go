package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/pkg/balancer"
	"github.com/allot-dev/allot/pkg/bucket"
	"github.com/allot-dev/allot/pkg/sim/scenario"
)

// populationCmd writes a scenario of many keys in the scenario format: a realistic
// population (issue 26), a few busy keys over their limits whose traffic moves, a middle
// of keys under their limits, and a long tail of small keys each used from one, two or
// three regions. The same flags and seed give the same bytes, so the shipped scenario
// (configs/scenarios/long-tail.yaml) is this command's output, regenerated with:
//
//	regionsim population -keys 10000 -seed 26 > configs/scenarios/long-tail.yaml
func populationCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("regionsim population", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p := population{}
	fs.IntVar(&p.keys, "keys", 10000, "how many keys (at most "+strconv.Itoa(scenario.MaxKeys)+")")
	fs.IntVar(&p.busy, "busy", 20, "how many of them are busy: over their limits, their traffic moving between regions")
	fs.IntVar(&p.middle, "middle", 1000, "how many are the middle: 10–100/s limits, under them")
	fs.Int64Var(&p.seed, "seed", 26, "the seed of the population (and of the scenario's arrivals)")
	fs.DurationVar(&p.duration, "duration", 10*time.Minute, "the scenario's duration")
	regions := fs.String("regions", "us-east=3,eu-west=3,ap-south=3", "region=enforcers, comma-separated")
	fs.DurationVar(&p.arrive, "arrive", 0, "spread the middle and tail keys' arrivals over the first ARRIVE of the run (whole seconds; 0: all at 0 s, the balancer as new as they are)")
	burst := fs.String("burst", "rate", "each key's burst: rate (the default, a second of its rate) or advised (what `balancer shares` advises for the key at its traffic's split, where that is more)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "regionsim population: unexpected arguments %q\n", fs.Args())
		return 2
	}
	switch *burst {
	case "rate":
	case "advised":
		p.advised = true
	default:
		fmt.Fprintf(stderr, "regionsim population: -burst %q: want rate or advised\n", *burst)
		return 2
	}
	for _, kv := range strings.Split(*regions, ",") {
		name, n, ok := strings.Cut(kv, "=")
		e, err := strconv.Atoi(n)
		if !ok || err != nil || e < 1 || name == "" {
			fmt.Fprintf(stderr, "regionsim population: -regions %q: want region=enforcers (enforcers ≥ 1), comma-separated\n", kv)
			return 2
		}
		p.regions = append(p.regions, name)
		p.enforcers = append(p.enforcers, e)
	}
	switch {
	case p.keys < 1 || p.keys > scenario.MaxKeys:
		fmt.Fprintf(stderr, "regionsim population: -keys %d: want 1–%d\n", p.keys, scenario.MaxKeys)
		return 2
	case p.busy < 0 || p.middle < 0 || p.busy+p.middle > p.keys:
		fmt.Fprintf(stderr, "regionsim population: -busy %d and -middle %d: want ≥ 0 and together at most -keys %d\n", p.busy, p.middle, p.keys)
		return 2
	case p.duration < time.Minute || p.duration > scenario.MaxDuration:
		fmt.Fprintf(stderr, "regionsim population: -duration %v: want 1m–%v\n", p.duration, scenario.MaxDuration)
		return 2
	case p.arrive < 0 || p.arrive >= p.duration-time.Minute:
		fmt.Fprintf(stderr, "regionsim population: -arrive %v: want ≥ 0 and at least a minute before -duration %v\n", p.arrive, p.duration)
		return 2
	case len(p.regions) < 2:
		fmt.Fprintln(stderr, "regionsim population: -regions: want at least two")
		return 2
	}
	w := bufio.NewWriter(stdout)
	p.write(w)
	if err := w.Flush(); err != nil {
		fmt.Fprintln(stderr, "regionsim population:", err)
		return 1
	}
	return 0
}

type population struct {
	keys, busy, middle int
	seed               int64
	duration           time.Duration
	regions            []string
	enforcers          []int
	// advised: a middle or tail key's burst is the one the balancer advises for it
	// (balancer.BurstCost) with its shares in proportion to its traffic, where that is
	// more than its rate's second.
	advised bool
	// arrive: a middle or tail key's traffic starts at a whole second drawn from [0,
	// arrive) (arrivals, its own generator, so the population is the same), none before
	// it: keys new to a balancer that has run a while.
	arrive   time.Duration
	arrivals *rand.Rand
}

func (p *population) write(w io.Writer) {
	rng := rand.New(rand.NewPCG(uint64(p.seed), 26))
	p.arrivals = rand.New(rand.NewPCG(uint64(p.seed), 27))
	flags, bursts := "", ""
	if p.arrive > 0 {
		flags = " -arrive " + p.arrive.String()
		bursts = `
# Arrivals: each middle and tail key's traffic starts at a whole second of the first
# ` + p.arrive.String() + `, none before it: keys new to a balancer that has run a while.`
	}
	if p.advised {
		flags += " -burst advised"
		bursts += `
# Bursts: where a key's burst of a second of its rate, cut between its regions in
# proportion to its traffic, would refuse 3 points more of a region's Poisson arrivals
# than one bucket of the limit, the burst the balancer advises for it (balancer shares;
# docs/design.md §9).`
	}
	fmt.Fprintf(w, `# A population of %d keys over %d regions for %v (issue 26): %d busy keys over their
# limits whose traffic moves between regions, %d keys in the middle (10–100/s, under their
# limits, from one to three regions) and a long tail of small keys (2–10/s limits, offered
# about half of them, most from one region). Every key must get its limit wherever its
# traffic is: steady_ratio ≥ 0.97, recovery ≤ 15 s, never over.%s Generated, not edited:
#
#   regionsim population -keys %d -busy %d -middle %d -seed %d -duration %v -regions %s%s
name: long-tail
duration: %ds
seed: %d
regions:
`, p.keys, len(p.regions), p.duration, p.busy, p.middle, bursts, p.keys, p.busy, p.middle, p.seed, p.duration,
		p.regionsFlag(), flags, int(p.duration.Seconds()), p.seed)
	for i, r := range p.regions {
		fmt.Fprintf(w, "  %s: {enforcers: %d}\n", r, p.enforcers[i])
	}
	fmt.Fprintln(w, "keys:")
	secs := int(p.duration.Seconds())
	for k := range p.keys {
		name := fmt.Sprintf("k%05d", k+1)
		switch {
		case k < p.busy:
			// Busy: 200–1,000/s, offered 1.5× in one or two regions, moving two or three
			// times at random moments (whole seconds, at least 90 s apart).
			rate := float64(200 + 50*rng.IntN(17))
			fmt.Fprintf(w, "  - {name: %s, limit: {rate: %s, per: 1s}, phases: [", name, num(rate))
			at, last := 0, uint64(0)
			for ph := 0; ph == 0 || at < secs-60; ph++ {
				if ph > 0 {
					fmt.Fprint(w, ", ")
				}
				off, set := p.spread(rng, 1.5*rate, 1+rng.IntN(2))
				for try := 0; try < 8 && set == last; try++ {
					off, set = p.spread(rng, 1.5*rate, 1+rng.IntN(2)) // a move: other regions
				}
				fmt.Fprintf(w, "{at: %ds, offered: {%s}}", at, off)
				at, last = at+90+rng.IntN(150), set
			}
			fmt.Fprintln(w, "]}")
		case k < p.busy+p.middle:
			// The middle: a Zipf-like limit from 100/s down to 10/s by rank, offered 50–90%
			// of it, from one to three regions.
			rank := float64(k-p.busy+1) / float64(p.middle)
			rate := math.Round(100 * math.Pow(0.1, rank))
			offered := rate * (0.5 + 0.4*rng.Float64())
			p.steadyKey(w, name, rate, p.spreadParts(rng, offered, p.regionCount(rng)))
		default:
			// The tail: 2–10/s, offered about half (40–60%), mostly from one region.
			rate := float64(2 + rng.IntN(9))
			offered := rate * (0.4 + 0.2*rng.Float64())
			p.steadyKey(w, name, rate, p.spreadParts(rng, offered, p.regionCount(rng)))
		}
	}
}

// regionCount: one region for 60% of the keys, two for 25%, three for 15%.
func (p *population) regionCount(rng *rand.Rand) int {
	switch x := rng.Float64(); {
	case x < 0.6:
		return 1
	case x < 0.85:
		return min(2, len(p.regions))
	default:
		return min(3, len(p.regions))
	}
}

// spread splits total over n distinct random regions, unevenly (each part 1–3 units): the
// offered map's text, and the set of regions it names (bit r for region r; MaxRegions is
// 64).
func (p *population) spread(rng *rand.Rand, total float64, n int) (text string, set uint64) {
	parts := p.spreadParts(rng, total, n)
	for _, pt := range parts {
		set |= 1 << pt.region
	}
	return p.offeredText(parts), set
}

// part is one region's offered rate, as written (rounded to hundredths).
type part struct {
	region  int
	offered float64
}

// spreadParts is spread's parts, in the order written.
func (p *population) spreadParts(rng *rand.Rand, total float64, n int) []part {
	idx := rng.Perm(len(p.regions))[:n]
	weights := make([]float64, n)
	sum := 0.0
	for i := range weights {
		weights[i] = 1 + 2*rng.Float64()
		sum += weights[i]
	}
	parts := make([]part, n)
	for i, r := range idx {
		parts[i] = part{r, math.Round(100*total*weights[i]/sum) / 100}
	}
	return parts
}

func (p *population) offeredText(parts []part) string {
	text := make([]string, len(parts))
	for i, pt := range parts {
		text[i] = p.regions[pt.region] + ": " + num(pt.offered)
	}
	return strings.Join(text, ", ")
}

// steadyKey writes a key of one phase from 0 s (from its arrival, with -arrive): its
// limit (with the advised burst, when p.advised and that is more than the rate's second)
// and its offered parts.
func (p *population) steadyKey(w io.Writer, name string, rate float64, parts []part) {
	limit := "rate: " + num(rate) + ", per: 1s"
	if b := p.burstFor(rate, parts); b > rate {
		limit += ", burst: " + num(b)
	}
	at := 0
	if p.arrive > 0 {
		at = p.arrivals.IntN(int(p.arrive.Seconds()))
	}
	fmt.Fprintf(w, "  - {name: %s, limit: {%s}, phases: [{at: %ds, offered: {%s}}]}\n", name, limit, at, p.offeredText(parts))
}

// burstFor is the burst the balancer advises for a key of rate/s (burst the rate) offered
// parts, its shares in proportion to them (balancer.BurstCost); the rate when !p.advised,
// when nothing is advised, or when no burst within the advice's bound would do.
func (p *population) burstFor(rate float64, parts []part) float64 {
	if !p.advised {
		return rate
	}
	total := 0.0
	for _, pt := range parts {
		total += pt.offered
	}
	shares, demand := make([]float64, len(p.regions)), make([]float64, len(p.regions))
	for _, pt := range parts {
		shares[pt.region], demand[pt.region] = pt.offered/total, pt.offered
	}
	_, advice := balancer.BurstCost([]bucket.Limit{{Name: "limit", Rate: rate, Burst: rate}}, 1, shares, demand)
	if advice == nil || advice.Burst == 0 {
		return rate
	}
	return advice.Burst
}

func (p *population) regionsFlag() string {
	parts := make([]string, len(p.regions))
	for i, r := range p.regions {
		parts[i] = r + "=" + strconv.Itoa(p.enforcers[i])
	}
	return strings.Join(parts, ",")
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

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
}

func (p *population) write(w io.Writer) {
	rng := rand.New(rand.NewPCG(uint64(p.seed), 26))
	fmt.Fprintf(w, `# A population of %d keys over %d regions for %v (issue 26): %d busy keys over their
# limits whose traffic moves between regions, %d keys in the middle (10–100/s, under their
# limits, from one to three regions) and a long tail of small keys (2–10/s limits, offered
# about half of them, most from one region). Every key must get its limit wherever its
# traffic is: steady_ratio ≥ 0.97, recovery ≤ 15 s, never over. Generated, not edited:
#
#   regionsim population -keys %d -busy %d -middle %d -seed %d -duration %v -regions %s
name: long-tail
duration: %ds
seed: %d
regions:
`, p.keys, len(p.regions), p.duration, p.busy, p.middle, p.keys, p.busy, p.middle, p.seed, p.duration,
		p.regionsFlag(), int(p.duration.Seconds()), p.seed)
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
			fmt.Fprintf(w, "  - {name: %s, limit: {rate: %s, per: 1s}, phases: [{at: 0s, offered: {%s}}]}\n",
				name, num(rate), p.spreadText(rng, offered, p.regionCount(rng)))
		default:
			// The tail: 2–10/s, offered about half (40–60%), mostly from one region.
			rate := float64(2 + rng.IntN(9))
			offered := rate * (0.4 + 0.2*rng.Float64())
			fmt.Fprintf(w, "  - {name: %s, limit: {rate: %s, per: 1s}, phases: [{at: 0s, offered: {%s}}]}\n",
				name, num(rate), p.spreadText(rng, offered, p.regionCount(rng)))
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
	idx := rng.Perm(len(p.regions))[:n]
	for _, r := range idx {
		set |= 1 << r
	}
	weights := make([]float64, n)
	sum := 0.0
	for i := range weights {
		weights[i] = 1 + 2*rng.Float64()
		sum += weights[i]
	}
	parts := make([]string, n)
	for i, r := range idx {
		parts[i] = p.regions[r] + ": " + num(math.Round(100*total*weights[i]/sum)/100)
	}
	return strings.Join(parts, ", "), set
}

func (p *population) spreadText(rng *rand.Rand, total float64, n int) string {
	text, _ := p.spread(rng, total, n)
	return text
}

func (p *population) regionsFlag() string {
	parts := make([]string, len(p.regions))
	for i, r := range p.regions {
		parts[i] = r + "=" + strconv.Itoa(p.enforcers[i])
	}
	return strings.Join(parts, ",")
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

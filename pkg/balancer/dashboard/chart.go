package dashboard

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// point is one value at one time; NaN breaks a line.
type point struct {
	t time.Time
	v float64
}

// series is one line of a chart: a region's colour, solid (share, allowance) or dashed
// (demand).
type series struct {
	color  int
	dashed bool
	pts    []point
}

// chartView is an inline SVG time chart, laid out in Go so the template only prints
// numbers (html/template escapes them like any other text).
type chartView struct {
	ID           string
	W, H         int
	X0, Y0       float64 // the plot area's top left
	X1, Y1       float64 // and bottom right
	Lines        []lineView
	Dots         []dotView
	YTicks       []tickView
	XTicks       []tickView
	MidX, MidY   float64
	Points       int // data points drawn, over every line
	Empty        bool
	EmptyMessage string
}

type lineView struct {
	Class  string
	Points string
}

type dotView struct {
	Class string
	X, Y  float64
}

type tickView struct {
	Pos   float64
	Label string
}

const (
	marginL = 44.0
	marginR = 10.0
	marginT = 8.0
	marginB = 18.0
)

// timeChart lays ss out over [from, to] × [0, ymax] (ymax ≤ 0: from the data). yfmt
// labels the y ticks. A line breaks at a NaN and where two points are more than gap
// apart (no samples in between: this replica was not leading).
func timeChart(id string, w, h int, from, to time.Time, gap time.Duration, ymax float64, yfmt func(float64) string, ss []series) chartView {
	c := chartView{ID: id, W: w, H: h, X0: marginL, Y0: marginT, X1: float64(w) - marginR, Y1: float64(h) - marginB}
	if ymax <= 0 {
		for _, s := range ss {
			for _, p := range s.pts {
				if !math.IsNaN(p.v) && !math.IsInf(p.v, 0) {
					ymax = max(ymax, p.v)
				}
			}
		}
		ymax = niceCeil(ymax * 1.05)
	}
	span := to.Sub(from)
	if span <= 0 {
		span = time.Second
		from = to.Add(-span)
	}
	x := func(t time.Time) float64 {
		return c.X0 + (c.X1-c.X0)*float64(t.Sub(from))/float64(span)
	}
	y := func(v float64) float64 {
		v = min(max(v, 0), ymax)
		return c.Y1 - (c.Y1-c.Y0)*v/ymax
	}
	for _, s := range ss {
		class := fmt.Sprintf("r%d", s.color%len(palette))
		if s.dashed {
			class += " dash"
		}
		var b strings.Builder
		flush := func() {
			if b.Len() > 0 {
				c.Lines = append(c.Lines, lineView{Class: class, Points: b.String()})
				b.Reset()
			}
		}
		var last *point
		for i := range s.pts {
			p := &s.pts[i]
			if math.IsNaN(p.v) || math.IsInf(p.v, 0) || p.t.Before(from) {
				flush()
				continue
			}
			if last != nil && p.t.Sub(last.t) > gap {
				flush()
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(num(x(p.t)))
			b.WriteByte(',')
			b.WriteString(num(y(p.v)))
			c.Points++
			last = p
		}
		flush()
		if last != nil && !s.dashed {
			c.Dots = append(c.Dots, dotView{Class: class, X: round1(x(last.t)), Y: round1(y(last.v))})
		}
	}
	c.Empty = c.Points == 0
	c.MidX, c.MidY = round1((c.X0+c.X1)/2), round1((c.Y0+c.Y1)/2)
	for _, f := range []float64{0, 0.5, 1} {
		c.YTicks = append(c.YTicks, tickView{Pos: round1(y(f * ymax)), Label: yfmt(f * ymax)})
	}
	step := niceStep(span)
	for t := to.Truncate(step); !t.Before(from); t = t.Add(-step) {
		c.XTicks = append(c.XTicks, tickView{Pos: round1(x(t)), Label: t.UTC().Format("15:04")})
	}
	return c
}

func num(v float64) string { return strconv.FormatFloat(round1(v), 'f', -1, 64) }

func round1(v float64) float64 { return math.Round(v*10) / 10 }

// niceCeil rounds v up to 1, 2 or 5 × a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if !(v > 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// niceStep is a tick spacing giving 3 to 6 ticks over span.
func niceStep(span time.Duration) time.Duration {
	for _, s := range []time.Duration{10 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
		10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour} {
		if span/s <= 6 {
			return s
		}
	}
	return 2 * time.Hour
}

// barView is a stacked horizontal bar: one segment per region, widths summing to ≤ W.
type barView struct {
	W, H     int
	Segments []segView
}

type segView struct {
	Class    string
	X, W     float64
	Label    string // "62%" when the segment is wide enough to hold it
	LabelX   float64
	Title    string
	HasLabel bool
}

// stackedBar lays fractions (one per region; NaN as 0) out over w pixels.
func stackedBar(w, h int, regions []string, fr []float64) barView {
	b := barView{W: w, H: h}
	x := 0.0
	for r, f := range fr {
		if math.IsNaN(f) || f <= 0 {
			continue
		}
		sw := min(f, 1) * float64(w)
		s := segView{Class: fmt.Sprintf("r%d", r%len(palette)), X: round1(x), W: round1(sw),
			Title: fmt.Sprintf("%s %s", regions[r], pct(f))}
		if sw >= 34 {
			s.HasLabel, s.Label, s.LabelX = true, pct(f), round1(x+sw/2)
		}
		b.Segments = append(b.Segments, s)
		x += sw
	}
	return b
}

// palette is the region colours (CSS classes r0…r7), distinct for colour-blind readers
// (Okabe–Ito).
var palette = []string{"#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000"}

func pct(f float64) string {
	if math.IsNaN(f) {
		return "–"
	}
	p := f * 100
	if p > 0 && p < 1 {
		return strconv.FormatFloat(p, 'f', 1, 64) + "%"
	}
	return strconv.FormatFloat(math.Round(p), 'f', 0, 64) + "%"
}

// rate formats tokens/s compactly.
func rate(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case v >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', 0, 64) + "k"
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 2, 64)
}

// tick labels an axis value: integers as integers, 3 significant digits otherwise.
func tick(v float64) string {
	if v >= 1e4 {
		return rate(v)
	}
	if v != 0 {
		p := math.Pow(10, 2-math.Floor(math.Log10(math.Abs(v))))
		v = math.Round(v*p) / p
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// age formats a duration to the second ("–" for none).
func age(d time.Duration) string {
	if d < 0 {
		return "–"
	}
	return d.Round(time.Second).String()
}

package sim

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// regionColors are the regions' colours in the plots, in scenario order (cycled).
var regionColors = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, // blue
	{0xff, 0x7f, 0x0e, 0xff}, // orange
	{0x2c, 0xa0, 0x2c, 0xff}, // green
	{0x94, 0x67, 0xbd, 0xff}, // purple
	{0x8c, 0x56, 0x4b, 0xff}, // brown
	{0xe3, 0x77, 0xc2, 0xff}, // pink
}

func regionColor(r int) color.RGBA { return regionColors[r%len(regionColors)] }

func lighter(c color.RGBA) color.RGBA {
	return color.RGBA{c.R/2 + 0x7f, c.G/2 + 0x7f, c.B/2 + 0x7f, 0xff}
}

// WritePlots writes, for each key the table lists (PlottedKeys), <dir>/<key>-admitted.{svg,png}
// (admitted requests/s per region stacked, against the global limit, with each region's
// offered traffic dashed) and <dir>/<key>-shares.{svg,png} (each region's share over
// time). It creates dir.
func (res *Result) WritePlots(dir string) error {
	if res.Keys == nil && len(res.Scenario.Keys) > 0 {
		return ErrNoDetail
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("sim: while creating %s: %w", dir, err)
	}
	for _, k := range res.PlottedKeys() {
		for _, mk := range []func(int) (*plot.Plot, string, error){res.admittedPlot, res.sharesPlot} {
			p, name, err := mk(k)
			if err != nil {
				return err
			}
			for _, ext := range []string{"svg", "png"} {
				path := filepath.Join(dir, name+"."+ext)
				if err := p.Save(22*vg.Centimeter, 11*vg.Centimeter, path); err != nil {
					return fmt.Errorf("sim: while writing %s: %w", path, err)
				}
			}
		}
	}
	return nil
}

// PlottedKeys are the indexes of the keys WritePlots draws: every key of a scenario of at
// most TableKeys keys, else the TableKeys worst, the ones WriteTable lists: drawing every
// key of the 10,000-key population wrote 40,000 files that no one reads. The CSV keeps
// every key's seconds.
func (res *Result) PlottedKeys() []int {
	if len(res.Scenario.Keys) > TableKeys && len(res.Verdicts) == len(res.Scenario.Keys) {
		return res.worst(TableKeys)
	}
	idx := make([]int, len(res.Scenario.Keys))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

func (res *Result) admittedPlot(k int) (*plot.Plot, string, error) {
	key := res.Scenario.Keys[k]
	regions := res.Scenario.Regions
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (%s, policy %s): admitted per region, stacked", key.Name, res.Scenario.Name, res.Policy)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "requests/s"
	p.Legend.Top = true
	// Stacked areas: region r's line is the sum of regions 0..r; drawn from the top down,
	// each filled to zero, so each band shows one region.
	stack := make([]plotter.XYs, len(regions))
	for r := range regions {
		stack[r] = make(plotter.XYs, res.Seconds)
		for s := 0; s < res.Seconds; s++ {
			below := 0.0
			if r > 0 {
				below = stack[r-1][s].Y
			}
			stack[r][s] = plotter.XY{X: float64(s), Y: below + float64(res.Cell(k, s, r).Admitted)}
		}
	}
	for r := len(regions) - 1; r >= 0; r-- {
		l, err := plotter.NewLine(stack[r])
		if err != nil {
			return nil, "", err
		}
		l.FillColor = lighter(regionColor(r))
		l.Color = regionColor(r)
		p.Add(l)
		p.Legend.Add(regions[r].Name+" admitted", l)
	}
	for r := range regions {
		off := make(plotter.XYs, res.Seconds)
		for s := range off {
			off[s] = plotter.XY{X: float64(s), Y: float64(res.Cell(k, s, r).Offered)}
		}
		l, err := plotter.NewLine(off)
		if err != nil {
			return nil, "", err
		}
		l.Color = regionColor(r)
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(regions[r].Name+" offered", l)
	}
	limit, err := plotter.NewLine(plotter.XYs{{X: 0, Y: key.Limit.PerSecond()}, {X: float64(res.Seconds), Y: key.Limit.PerSecond()}})
	if err != nil {
		return nil, "", err
	}
	limit.Color = color.RGBA{0xd6, 0x27, 0x28, 0xff}
	limit.Width = vg.Points(2)
	p.Add(limit)
	p.Legend.Add("global limit", limit)
	p.Y.Min = 0
	return p, key.Name + "-admitted", nil
}

func (res *Result) sharesPlot(k int) (*plot.Plot, string, error) {
	key := res.Scenario.Keys[k]
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s (%s, policy %s): share of the global limit per region", key.Name, res.Scenario.Name, res.Policy)
	p.X.Label.Text = "seconds"
	p.Y.Label.Text = "share"
	p.Legend.Top = true
	for r, reg := range res.Scenario.Regions {
		xy := make(plotter.XYs, res.Seconds)
		for s := range xy {
			xy[s] = plotter.XY{X: float64(s), Y: res.Cell(k, s, r).Share}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, "", err
		}
		l.Color = regionColor(r)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(reg.Name, l)
	}
	p.Y.Min, p.Y.Max = 0, 1.05
	return p, key.Name + "-shares", nil
}

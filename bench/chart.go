package main

import (
	"bytes"
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// chartPalette tells the systems apart: greys and browns for the
// baselines, blues and greens for ours on the classic transport,
// purples and teals on io_uring (in systemOrder).
var chartPalette = []color.RGBA{
	{0x9e, 0x9e, 0x9e, 0xff}, // plain dir
	{0x52, 0x52, 0x52, 0xff}, // plain dir + fsync
	{0xe6, 0x9f, 0x00, 0xff}, // mqueue
	{0xd5, 0x5e, 0x00, 0xff}, // goqite-style
	{0xcc, 0x79, 0xa7, 0xff}, // queuecore normal
	{0x88, 0x22, 0x55, 0xff}, // queuecore full
	{0x00, 0x00, 0x00, 0xff}, // loopback
	{0x56, 0xb4, 0xe9, 0xff}, // mount sqlite/normal (classic)
	{0x00, 0x5a, 0x9c, 0xff}, // mount sqlite/full (classic)
	{0x5c, 0xc8, 0x63, 0xff}, // mount fs/normal (classic)
	{0x00, 0x7a, 0x3d, 0xff}, // mount fs/full (classic)
	{0xb3, 0x8c, 0xd9, 0xff}, // mount sqlite/normal (uring)
	{0x5e, 0x2c, 0x80, 0xff}, // mount sqlite/full (uring)
	{0x5f, 0xd3, 0xd3, 0xff}, // mount fs/normal (uring)
	{0x0b, 0x6e, 0x78, 0xff}, // mount fs/full (uring)
	{0xf0, 0xe4, 0x42, 0xff},
	{0x99, 0x99, 0xff, 0xff},
}

// chartPNG draws ops/s per operation and system, one panel per client
// count, as a grouped bar chart on a log scale (the systems span three
// orders of magnitude), with the legend to the right.
func (r *suiteResults) chartPNG() ([]byte, error) {
	systems := r.systemOrder()
	clients := r.clientCounts()
	if len(systems) == 0 || len(clients) == 0 {
		return nil, fmt.Errorf("no results to draw")
	}
	lo, hi := math.Inf(1), 0.0
	for _, x := range r.Rows {
		if x.OpsPerSec > 0 {
			lo, hi = min(lo, x.OpsPerSec), max(hi, x.OpsPerSec)
		}
	}
	// Bars start at the decade below the slowest figure.
	base := math.Pow(10, math.Floor(math.Log10(lo)))
	top := hi * 1.6

	const width, panelH = 15 * vg.Inch, 5 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(width, panelH*vg.Length(len(clients))), vgimg.UseDPI(96))
	dc := draw.New(img)
	legendW := 3.3 * vg.Inch
	plotArea := draw.Crop(dc, 0, -legendW, 0, 0)
	legendArea := draw.Crop(dc, width-legendW, 0, 0, 0)

	// About 10.5 in of data width: 80% of each operation's share.
	barW := 10.5 * vg.Inch / vg.Length(len(suiteOps)) * 0.8 / vg.Length(len(systems))
	labels := map[string]string{"roundtrip": "round trip"}
	var plots [][]*plot.Plot
	legend := plot.NewLegend()
	legend.TextStyle.Font.Size = vg.Points(13)
	legend.ThumbnailWidth = vg.Points(20)
	legend.Padding = vg.Points(4)
	for ci, c := range clients {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%d client(s): messages per second (log scale), %s mode, %s", c, r.Mode, r.Started)
		p.Title.TextStyle.Font.Size = vg.Points(14)
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = shortLogTicks{}
		p.Y.Min, p.Y.Max = base, top
		p.Y.Label.Text = "ops/s"
		p.Y.Tick.Label.Font.Size = vg.Points(12)
		p.X.Tick.Label.Font.Size = vg.Points(14)
		grid := plotter.NewGrid()
		grid.Vertical.Color = nil
		p.Add(grid)
		names := make([]string, len(suiteOps))
		for i, op := range suiteOps {
			names[i] = op
			if l, ok := labels[op]; ok {
				names[i] = l
			}
		}
		p.NominalX(names...)
		p.X.Min, p.X.Max = -0.5, float64(len(suiteOps))-0.5
		// A bar chart grows from 0, which a log scale cannot place: each
		// bar stands on an invisible one as high as the axis minimum.
		floorVals := make(plotter.Values, len(suiteOps))
		for i := range floorVals {
			floorVals[i] = base
		}
		stand, err := plotter.NewBarChart(floorVals, barW)
		if err != nil {
			return nil, err
		}
		for si, sys := range systems {
			vals := make(plotter.Values, len(suiteOps))
			for i, op := range suiteOps {
				if x, ok := r.findRow(sys, op, c); ok && x.OpsPerSec > base {
					vals[i] = x.OpsPerSec - base
				}
			}
			bars, err := plotter.NewBarChart(vals, barW)
			if err != nil {
				return nil, err
			}
			bars.StackOn(stand)
			bars.Color = chartPalette[si%len(chartPalette)]
			bars.LineStyle.Width = vg.Points(0.5)
			bars.Offset = vg.Length(float64(si)-float64(len(systems)-1)/2) * barW
			p.Add(bars)
			if ci == 0 {
				name := sys
				if _, ok := r.findRow(sys, "ack", c); !ok {
					name += " (no ack)"
				}
				legend.Add(name, bars)
			}
		}
		plots = append(plots, []*plot.Plot{p})
	}
	tiles := draw.Tiles{Rows: len(clients), Cols: 1, PadX: vg.Points(10), PadY: vg.Points(16), PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(10)}
	canvases := plot.Align(plots, tiles, plotArea)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	legend.Top, legend.Left = true, true
	legend.Draw(draw.Crop(legendArea, vg.Points(6), 0, 0, -vg.Points(40)))
	var buf bytes.Buffer
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// shortLogTicks are plot.LogTicks labelled 100, 1k, 10k, 1M.
type shortLogTicks struct{}

func (shortLogTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.LogTicks{Prec: -1}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label == "" {
			continue
		}
		switch v := t.Value; {
		case v >= 1e6:
			ticks[i].Label = fmt.Sprintf("%gM", v/1e6)
		case v >= 1e3:
			ticks[i].Label = fmt.Sprintf("%gk", v/1e3)
		default:
			ticks[i].Label = fmt.Sprintf("%g", v)
		}
	}
	return ticks
}

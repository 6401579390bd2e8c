package benchmarks

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// plotColors are the lines' colours, one per client in metaClients' order;
// resilix's, the last, is drawn thickest.
var plotColors = []string{"#7f7f7f", "#1f77b4", "#d62728", "#9467bd", "#ff7f0e", "#8c564b", "#2ca02c"}

// plot draws outs as an SVG of two panels over the same time axis: above,
// the goodput of each second (the share of the calls issued in it that
// succeeded within their deadline); below, the server's queue at each
// second's end, on a log scale. The trigger is shaded.
func plot(outs []outcome) string {
	const (
		w, left, right = 900.0, 60.0, 170.0
		top, panelH    = 30.0, 220.0
		gap            = 50.0
	)
	sc := outs[0].sc
	perSec := int(time.Second / slot)
	secs := sc.slots() / perSec
	pw := w - left - right
	x := func(sec float64) float64 { return left + pw*sec/float64(secs) }
	y1 := func(frac float64) float64 { return top + panelH*(1-frac) }
	top2 := top + panelH + gap
	maxQ := 1.0
	for _, o := range outs {
		maxQ = max(maxQ, float64(o.peakQueue(0, len(o.s.queue))))
	}
	decades := max(math.Ceil(math.Log10(maxQ+1)), 1)
	y2 := func(q float64) float64 { return top2 + panelH*(1-math.Log10(q+1)/decades) }

	var b strings.Builder
	h := top2 + panelH + 40
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	from, to := sc.calm.Seconds(), (sc.calm + sc.trigger).Seconds()
	for _, pt := range []float64{top, top2} {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f3d9d9"/>`+"\n", x(from), pt, x(to)-x(from), panelH)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>`+"\n", left, pt, pw, panelH)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">trigger: %d× service time</text>`+"\n", (x(from)+x(to))/2, top+panelH-8, sc.slowdown)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">goodput (share of each second's calls that succeeded within %v)</text>`+"\n", left, top-8, sc.deadline)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">server queue at each second's end (log scale)</text>`+"\n", left, top2-8)
	for _, f := range []float64{0, 0.25, 0.5, 0.75, 0.95, 1} {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+pw, y1(f), y1(f))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f%%</text>`+"\n", left-5, y1(f)+4, 100*f)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">0</text>`+"\n", left-5, y2(0)+4)
	for d := 0.0; d <= decades; d++ {
		q := math.Pow(10, d)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+pw, y2(q), y2(q))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", left-5, y2(q)+4, q)
	}
	for s := 0; s <= secs; s += 2 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x(float64(s)), top2+panelH+15, s)
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">seconds</text>`+"\n", left+pw/2, top2+panelH+32)
	for i, o := range outs {
		color := plotColors[i%len(plotColors)]
		width := 1.5
		if o.name == "resilix" {
			width = 3
		}
		var good, queue []string
		for s := range secs {
			mid := float64(s) + 0.5
			good = append(good, fmt.Sprintf("%.1f,%.1f", x(mid), y1(o.goodput(s*perSec, (s+1)*perSec))))
			queue = append(queue, fmt.Sprintf("%.1f,%.1f", x(mid), y2(float64(o.s.queue[(s+1)*perSec-1]))))
		}
		for _, pts := range [][]string{good, queue} {
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" points="%s"/>`+"\n", color, width, strings.Join(pts, " "))
		}
		ly := top + 10 + 18*float64(i)
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`+"\n", left+pw+10, left+pw+30, ly, ly, color, width)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", left+pw+35, ly+4, o.name)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

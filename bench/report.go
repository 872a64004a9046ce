package bench

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"math"
	"strings"
)

// WriteReport renders a self-contained HTML page (inline SVG, no scripts or external files)
// for a result: throughput and latency over time, the latency percentile curve, the summary,
// disk-limit ratios, the baseline if there is one, and the config.
func WriteReport(w io.Writer, res *Result) error {
	results := []*Result{res}
	if res.Baseline != nil {
		results = append(results, res.Baseline)
	}
	if res.Reads != nil {
		results = append(results, res.Reads)
	}
	cfg, _ := json.MarshalIndent(res.Config, "", "  ")
	data := struct {
		Results    []*Result
		Throughput template.HTML
		Latency    template.HTML
		Percentile template.HTML
		Config     string
	}{
		Results:    results,
		Throughput: lineChart("Throughput (ops/s)", results, func(s Sample) float64 { return s.OpsPerSec }, false),
		Latency:    lineChart("p99 latency per second (µs, log scale)", results, func(s Sample) float64 { return s.P99Us }, true),
		Percentile: percentileChart(results),
		Config:     string(cfg),
	}
	return reportTemplate.Execute(w, data)
}

var reportTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"f1": func(v float64) string { return fmt.Sprintf("%.1f", v) },
	"f0": func(v float64) string { return fmt.Sprintf("%.0f", v) },
	"f2": func(v float64) string { return fmt.Sprintf("%.2f", v) },
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>ringkeeper bench: {{(index .Results 0).Workload}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
svg{background:#fff;border:1px solid #ddd;margin:0.5em 0}pre{background:#f7f7f7;padding:1em;overflow:auto}
.legend span{display:inline-block;margin-right:1.5em}
</style></head><body>
<h1>ringkeeper bench: {{(index .Results 0).Workload}}</h1>
<table><tr><th>workload</th><th>ops</th><th>ops/s</th><th>MB/s</th><th>p50 µs</th><th>p90 µs</th><th>p99 µs</th><th>p99.9 µs</th><th>max µs</th><th>errors</th></tr>
{{range .Results}}<tr><td>{{.Workload}}</td><td>{{.Ops}}</td><td>{{f0 .OpsPerSec}}</td><td>{{f1 .MBPerSec}}</td><td>{{f1 .LatencyUs.P50}}</td><td>{{f1 .LatencyUs.P90}}</td><td>{{f1 .LatencyUs.P99}}</td><td>{{f1 .LatencyUs.P999}}</td><td>{{f1 .LatencyUs.Max}}</td><td>{{.Errors}}</td></tr>
{{end}}</table>
{{with (index .Results 0).Ratios}}<h2>Against the disk's limit (measured in the same run)</h2>
<table><tr><th>figure</th><th>ours</th><th>disk limit</th><th>ratio</th></tr>
{{range .}}<tr><td>{{.Name}}</td><td>{{f1 .Value}}</td><td>{{f1 .Limit}}</td><td>{{f2 .Ratio}}</td></tr>{{end}}</table>{{end}}
<h2>Throughput over time</h2>{{.Throughput}}
<h2>Tail latency over time</h2>{{.Latency}}
<h2>Latency percentiles</h2>{{.Percentile}}
<h2>Config</h2><pre>{{.Config}}</pre>
</body></html>
`))

var seriesColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd"}

const chartW, chartH, padL, padB, padT, padR = 900.0, 300.0, 70.0, 40.0, 20.0, 20.0

func legend(results []*Result) string {
	var b strings.Builder
	b.WriteString(`<div class="legend">`)
	for i, r := range results {
		fmt.Fprintf(&b, `<span style="color:%s">■ %s</span>`, seriesColors[i%len(seriesColors)], template.HTMLEscapeString(r.Workload))
	}
	b.WriteString(`</div>`)
	return b.String()
}

// lineChart plots a per-second series of every result.
func lineChart(title string, results []*Result, y func(Sample) float64, logY bool) template.HTML {
	var maxX, maxY float64
	minY := math.Inf(1)
	for _, r := range results {
		for _, s := range r.Timeline {
			maxX = max(maxX, s.ElapsedS)
			if v := y(s); v > 0 {
				maxY = max(maxY, v)
				minY = min(minY, v)
			}
		}
	}
	if maxX == 0 || maxY == 0 {
		return template.HTML("<p>(no samples)</p>")
	}
	scaleY := func(v float64) float64 {
		if logY {
			lo, hi := math.Log10(max(minY, 1e-3)), math.Log10(maxY)
			if hi <= lo {
				hi = lo + 1
			}
			return chartH - padB - (math.Log10(max(v, 1e-3))-lo)/(hi-lo)*(chartH-padB-padT)
		}
		return chartH - padB - v/(maxY*1.05)*(chartH-padB-padT)
	}
	scaleX := func(v float64) float64 { return padL + v/maxX*(chartW-padL-padR) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%.0f" height="%.0f" xmlns="http://www.w3.org/2000/svg">`, chartW, chartH)
	fmt.Fprintf(&b, `<text x="%.0f" y="14" font-size="13">%s</text>`, padL, template.HTMLEscapeString(title))
	axes(&b)
	for i := 0; i <= 4; i++ {
		var v float64
		if logY {
			lo, hi := math.Log10(max(minY, 1e-3)), math.Log10(maxY)
			v = math.Pow(10, lo+(hi-lo)*float64(i)/4)
		} else {
			v = maxY * 1.05 * float64(i) / 4
		}
		fmt.Fprintf(&b, `<text x="4" y="%.1f" font-size="11">%s</text>`, scaleY(v)+4, humanize(v))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="11">%.0f s</text>`, chartW-padR-30, chartH-10, maxX)
	for i, r := range results {
		var pts []string
		for _, s := range r.Timeline {
			if v := y(s); v > 0 || !logY {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", scaleX(s.ElapsedS), scaleY(v)))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, seriesColors[i%len(seriesColors)], strings.Join(pts, " "))
	}
	b.WriteString(`</svg>`)
	b.WriteString(legend(results))
	return template.HTML(b.String())
}

// percentileChart plots latency against percentile on a "nines" axis (−log10(1−p)).
func percentileChart(results []*Result) template.HTML {
	nines := func(p float64) float64 { return -math.Log10(max(1-p/100, 1e-5)) }
	var maxX, maxY, minY = 0.0, 0.0, math.Inf(1)
	for _, r := range results {
		for _, pt := range r.HistogramUs {
			if pt.Percentile >= 100 || pt.Us <= 0 {
				continue
			}
			maxX = max(maxX, nines(pt.Percentile))
			maxY = max(maxY, pt.Us)
			minY = min(minY, pt.Us)
		}
	}
	if maxY == 0 {
		return template.HTML("<p>(no latency data)</p>")
	}
	lo, hi := math.Log10(minY), math.Log10(maxY)
	if hi <= lo {
		hi = lo + 1
	}
	sx := func(x float64) float64 { return padL + x/maxX*(chartW-padL-padR) }
	sy := func(us float64) float64 {
		return chartH - padB - (math.Log10(us)-lo)/(hi-lo)*(chartH-padB-padT)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg width="%.0f" height="%.0f" xmlns="http://www.w3.org/2000/svg">`, chartW, chartH)
	b.WriteString(`<text x="70" y="14" font-size="13">latency (µs, log scale) by percentile</text>`)
	axes(&b)
	for _, p := range []float64{0, 50, 90, 99, 99.9, 99.99} {
		if x := nines(p); x <= maxX {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="11">p%g</text>`, sx(x)-8, chartH-20, p)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/>`, sx(x), padT, sx(x), chartH-padB)
		}
	}
	for i := 0; i <= 4; i++ {
		v := math.Pow(10, lo+(hi-lo)*float64(i)/4)
		fmt.Fprintf(&b, `<text x="4" y="%.1f" font-size="11">%s</text>`, sy(v)+4, humanize(v))
	}
	for i, r := range results {
		var pts []string
		for _, pt := range r.HistogramUs {
			if pt.Percentile >= 100 || pt.Us <= 0 {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", sx(nines(pt.Percentile)), sy(pt.Us)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, seriesColors[i%len(seriesColors)], strings.Join(pts, " "))
	}
	b.WriteString(`</svg>`)
	b.WriteString(legend(results))
	return template.HTML(b.String())
}

func axes(b *strings.Builder) {
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#888"/>`, padL, padT, padL, chartH-padB)
}

func humanize(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

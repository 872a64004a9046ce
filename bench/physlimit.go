package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// PhysLimitOptions says how to measure the disk's limit.
type PhysLimitOptions struct {
	// Tool is the path of physlimit; empty means search ../shared/tools/physlimit upwards from
	// the working directory, then $PATH.
	Tool string
	// Dir is the directory whose file system is measured.
	Dir string
	// Seconds per fio job.
	Seconds int
	// Jobs limits the jobs (empty: all).
	Jobs []string
}

// FindPhysLimit locates the physlimit tool.
func FindPhysLimit() (string, error) {
	if dir, err := os.Getwd(); err == nil {
		for d := dir; ; d = filepath.Dir(d) {
			p := filepath.Join(d, "..", "shared", "tools", "physlimit")
			if _, err := os.Stat(p); err == nil {
				return filepath.Clean(p), nil
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	if p, err := exec.LookPath("physlimit"); err == nil {
		return p, nil
	}
	return "", errors.New("bench: physlimit not found (expected ../shared/tools/physlimit or physlimit in $PATH); it needs fio: apt-get install -y fio")
}

// RunPhysLimit runs physlimit and returns its jobs. Progress goes to log.
func RunPhysLimit(ctx context.Context, o PhysLimitOptions, log io.Writer) (map[string]PhysLimitJob, error) {
	tool := o.Tool
	if tool == "" {
		var err error
		if tool, err = FindPhysLimit(); err != nil {
			return nil, err
		}
	}
	args := []string{"--dir", o.Dir, "--json"}
	if o.Seconds > 0 {
		args = append(args, "--seconds", strconv.Itoa(o.Seconds))
	}
	if len(o.Jobs) > 0 {
		args = append(args, "--only", strings.Join(o.Jobs, ","))
	}
	if log != nil {
		fmt.Fprintf(log, "measuring the disk's limit: %s %s\n", tool, strings.Join(args, " "))
	}
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bench: physlimit: %w", err)
	}
	jobs := make(map[string]PhysLimitJob)
	if err := json.Unmarshal(out, &jobs); err != nil {
		return nil, fmt.Errorf("bench: physlimit output %q: %w", out, err)
	}
	return jobs, nil
}

// Ratio is a measured figure divided by a physical limit.
type Ratio struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Limit float64 `json:"limit"`
	Ratio float64 `json:"ratio"`
}

// PhysRatios compares res with the disk's limits: throughput against the sync jobs and seq1m,
// median latency against sync4k, read rates against the read jobs.
func PhysRatios(res *Result) []Ratio {
	var out []Ratio
	add := func(name string, value, limit float64) {
		if limit > 0 {
			out = append(out, Ratio{Name: name, Value: value, Limit: limit, Ratio: value / limit})
		}
	}
	pl := res.PhysLimit
	switch res.Workload {
	case "read-random":
		add("ops/s vs randread4k ops/s", res.OpsPerSec, pl["randread4k"].OpsPerSec)
	case "read-sequential":
		add("MB/s vs seqread1m MB/s", res.MBPerSec, pl["seqread1m"].MBPerSec)
	default:
		add("MB/s vs sync1m MB/s", res.MBPerSec, pl["sync1m"].MBPerSec)
		add("MB/s vs seq1m MB/s", res.MBPerSec, pl["seq1m"].MBPerSec)
		add("p50 vs sync4k p50", res.LatencyUs.P50, pl["sync4k"].P50Us)
	}
	return out
}

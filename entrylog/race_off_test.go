//go:build !race

package entrylog

// raceEnabled is set under the race detector: the sweep tests then try fewer points.
const raceEnabled = false

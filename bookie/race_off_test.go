//go:build !race

package bookie

// raceEnabled is set under the race detector (see TestFloodIsBoundedAndFair).
const raceEnabled = false

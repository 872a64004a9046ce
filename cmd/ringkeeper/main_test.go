package main

import (
	"runtime"
	"testing"
)

func TestSetProcsDoublesTheDefaultUnlessTheUserChose(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)

	t.Setenv("GOMAXPROCS", "")
	setProcs()
	if got := runtime.GOMAXPROCS(0); got != procsPerCPU*before {
		t.Fatalf("GOMAXPROCS %d after setProcs, want %d × %d", got, procsPerCPU, before)
	}
	runtime.GOMAXPROCS(before)

	t.Setenv("GOMAXPROCS", "1")
	setProcs()
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS %d after setProcs with the variable set, want it left at %d", got, before)
	}
}

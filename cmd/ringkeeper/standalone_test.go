package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/ringkeeper/ringkeeper/client"
)

func freePorts(t *testing.T, n int) int {
	t.Helper()
	// n consecutive free ports: try random bases until all are free.
	for attempt := 0; attempt < 50; attempt++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ok := base+n < 65535
		for i := 0; ok && i < n; i++ {
			ok = portFree(base+i) == nil
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// syncBuffer is a bytes.Buffer safe for a writer and a poller.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runStandalone starts `ringkeeper standalone` in-process and returns its metadata URI and a
// stop function that cancels it (as Ctrl-C would) and returns its error.
func runStandalone(t *testing.T, dir string, port, mdPort int) (string, func() error) {
	t.Helper()
	cmd := standaloneCommand()
	out := &syncBuffer{}
	cmd.SetOut(out)
	cmd.SetArgs([]string{"--data-dir", dir, "--bookies", "2", "--port", strconv.Itoa(port),
		"--metadata-port", strconv.Itoa(mdPort), "--http-port", "0", "--write-cache-mb", "16"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(out.String(), "ready") {
		select {
		case err := <-done:
			cancel()
			t.Fatalf("standalone exited: %v (%s)", err, out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("standalone did not get ready")
		}
	}
	line := out.String()
	uri := strings.Fields(line[strings.Index(line, "metadata ")+len("metadata "):])[0]
	return uri, func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second):
			return context.DeadlineExceeded
		}
	}
}

func TestStandaloneServesStopsAndKeepsData(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	port, mdPort := freePorts(t, 2), freePorts(t, 1)
	uri, stop := runStandalone(t, dir, port, mdPort)
	ctx := context.Background()
	cl, err := client.New(ctx, client.DefaultConfig(uri))
	if err != nil {
		t.Fatal(err)
	}
	lh, err := cl.CreateLedger(ctx, client.CreateOptions{EnsembleSize: 2, WriteQuorum: 2, AckQuorum: 2, Password: []byte("p")})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := lh.Append(ctx, []byte("entry-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := lh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	if err := stop(); err != nil {
		t.Fatalf("clean stop: %v", err)
	}
	// The ports are free again after a clean stop.
	if err := portFree(port); err != nil {
		t.Fatalf("bookie port still in use after stop: %v", err)
	}
	uri, stop = runStandalone(t, dir, port, mdPort)
	defer stop()
	cl, err = client.New(ctx, client.DefaultConfig(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rh, err := cl.OpenLedger(ctx, lh.ID(), []byte("p"), false)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := rh.Read(ctx, 0, 9)
	if err != nil || len(entries) != 10 || string(entries[9].Payload) != "entry-9" {
		t.Fatalf("after restart: %d entries, %v", len(entries), err)
	}
}

func TestStandalonePortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	cmd := standaloneCommand()
	cmd.SetArgs([]string{"--data-dir", t.TempDir(), "--port", strconv.Itoa(port), "--metadata-port", strconv.Itoa(freePorts(t, 1))})
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	err = cmd.ExecuteContext(context.Background())
	if err == nil || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Fatalf("port in use: %v", err)
	}
}

// TestStandaloneRefusesBadSizes: --bookies below 1 and a --write-cache-mb that is not positive
// or whose bytes overflow are errors naming the flag, before anything starts (--bookies -1
// panicked after etcd had started; --bookies 0 started 3 bookies on unchecked ports; the write
// cache size wrapped).
func TestStandaloneRefusesBadSizes(t *testing.T) {
	for _, tc := range []struct{ flag, value string }{
		{"--bookies", "-1"},
		{"--bookies", "0"},
		{"--write-cache-mb", "17592186044480"}, // << 20 overflows int64
		{"--write-cache-mb", "0"},
		{"--write-cache-mb", "-16"},
	} {
		cmd := standaloneCommand()
		dataDir := filepath.Join(t.TempDir(), "data")
		cmd.SetArgs([]string{"--data-dir", dataDir, tc.flag, tc.value, "--port", strconv.Itoa(freePorts(t, 3)),
			"--metadata-port", strconv.Itoa(freePorts(t, 1)), "--http-port", "0"})
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		err := func() (err error) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("standalone %s %s panicked: %v", tc.flag, tc.value, r)
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // if it serves, it stops
			defer cancel()
			return cmd.ExecuteContext(ctx)
		}()
		if err == nil || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("standalone %s %s: %v, want an error naming %s", tc.flag, tc.value, err, tc.flag)
		}
		if _, serr := os.Stat(dataDir); !os.IsNotExist(serr) {
			t.Errorf("standalone %s %s: refused (%v), but it created %s", tc.flag, tc.value, err, dataDir)
		}
	}
}

// TestStandaloneSameDataDirSpeltAbsolutely: restarting on the same --data-dir keeps every
// ledger, however the directory is named: relatively on the first run, absolutely (or from
// another working directory) on the next.
func TestStandaloneSameDataDirSpeltAbsolutely(t *testing.T) {
	root := t.TempDir()
	t.Chdir(root)
	port, mdPort := freePorts(t, 2), freePorts(t, 1)
	_, stop := runStandalone(t, "data", port, mdPort)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	_, stop = runStandalone(t, filepath.Join(root, "data"), port, mdPort)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	_, stop = runStandalone(t, filepath.Join("..", filepath.Base(root), "data"), port, mdPort)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestStandaloneRefusesBadPorts: a --port that does not give every bookie a port in
// [1, 65535], or a --metadata-port outside [0, 65535], is an error naming the flag before
// anything starts. --port 0 started bookies on random ports, whose ids (the address) then
// differed on the next run: the restart on the same data dir failed its cookie checks. Ports
// past 65535 were reported as "in use".
func TestStandaloneRefusesBadPorts(t *testing.T) {
	for _, args := range [][]string{
		{"--port", "0"},
		{"--port", "-3"},
		{"--port", "65534", "--bookies", "3"},
		{"--port", strconv.Itoa(freePorts(t, 3)), "--metadata-port", "-1"},
		{"--port", strconv.Itoa(freePorts(t, 3)), "--metadata-port", "70000"},
	} {
		cmd := standaloneCommand()
		dataDir := filepath.Join(t.TempDir(), "data")
		flag := args[len(args)-2]
		if args[0] == "--port" && flag == "--bookies" {
			flag = "--port"
		}
		cmd.SetArgs(append([]string{"--data-dir", dataDir, "--http-port", "0", "--write-cache-mb", "16"}, args...))
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // if it serves, it stops
		err := cmd.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), flag) || strings.Contains(err.Error(), "in use") {
			t.Errorf("standalone %v: %v, want an error naming %s (not a port in use)", args, err, flag)
		}
		if _, serr := os.Stat(dataDir); !os.IsNotExist(serr) {
			t.Errorf("standalone %v: refused (%v), but it created %s", args, err, dataDir)
		}
	}
}

// TestStandaloneAndBookieRefuseArguments: `standalone` and `bookie` take flags only. A word
// after them (`ringkeeper bookie bk_server.conf`, the --conf forgotten; `ringkeeper standalone
// mydata` for --data-dir) was ignored: the bookie started with the default settings (its data
// in /tmp/bk-txn and /tmp/bk-data), the standalone on ./data. It is an error naming the word,
// before anything is started or written.
func TestStandaloneAndBookieRefuseArguments(t *testing.T) {
	for _, tc := range []struct {
		cmd  func() *cobra.Command
		args func(data string) []string
	}{
		{standaloneCommand, func(data string) []string {
			return []string{"--data-dir", data, "--bookies", "1", "--port", strconv.Itoa(freePorts(t, 1)),
				"--metadata-port", strconv.Itoa(freePorts(t, 1)), "--http-port", "0", "--write-cache-mb", "16", "stray"}
		}},
		{bookieCommand, func(data string) []string {
			return []string{"--journal-dirs", filepath.Join(data, "j"), "--ledger-dirs", filepath.Join(data, "l"),
				"--port", strconv.Itoa(freePorts(t, 1)), "--http-port", "0", "--metadata", "etcd://127.0.0.1:1/ledgers", "stray"}
		}},
	} {
		data := filepath.Join(t.TempDir(), "data")
		args := tc.args(data)
		cmd := tc.cmd()
		cmd.SetArgs(args)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // if it serves, it stops
		err := cmd.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), `"stray"`) {
			t.Errorf("%s %q: %v, want an error naming the argument", cmd.Name(), args, err)
		}
		if _, serr := os.Stat(data); !os.IsNotExist(serr) {
			t.Errorf("%s %q: refused (%v), but it wrote %s", cmd.Name(), args, err, data)
		}
	}
}

// TestStandaloneRefusesBadHTTPPorts: an --http-port that does not give every bookie a port in
// [1, 65535] (0 turns HTTP off), or one in use, is an error naming the flag before anything
// starts or is written. A negative one served the bookies' metrics and admin API on random
// ports, which nothing printed; one past 65535 or in use failed the start with an error naming
// prometheusStatsHttpPort, after etcd had started in the data dir.
func TestStandaloneRefusesBadHTTPPorts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct{ httpPort, want string }{
		{"-5", "--http-port"},
		{"65534", "--http-port"}, // the second bookie's port would be 65535, the third's 65536
		{strconv.Itoa(busy - 1), "in use"},
	} {
		cmd := standaloneCommand()
		dataDir := filepath.Join(t.TempDir(), "data")
		cmd.SetArgs([]string{"--data-dir", dataDir, "--bookies", "3", "--port", strconv.Itoa(freePorts(t, 3)),
			"--metadata-port", strconv.Itoa(freePorts(t, 1)), "--write-cache-mb", "16", "--http-port", tc.httpPort})
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // if it serves, it stops
		err := cmd.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "--http-port") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("standalone --bookies 3 --http-port %s: %v, want an error naming --http-port (%s)", tc.httpPort, err, tc.want)
		}
		if _, serr := os.Stat(dataDir); !os.IsNotExist(serr) {
			t.Errorf("standalone --http-port %s: refused (%v), but it created %s", tc.httpPort, err, dataDir)
		}
	}
}

// TestStandaloneRefusesOverlappingPorts: the bookies' ports (--port), their HTTP ports
// (--http-port) and etcd's (--metadata-port) must all differ; an overlap is an error naming the
// flags before anything starts. Each port was checked free on its own, so the start failed on
// the port the cluster itself had taken first, after etcd had started in the data dir.
func TestStandaloneRefusesOverlappingPorts(t *testing.T) {
	base := freePorts(t, 6)
	for _, tc := range []struct {
		args []string
		want [2]string
	}{
		{[]string{"--port", strconv.Itoa(base), "--http-port", strconv.Itoa(base + 2), "--metadata-port", strconv.Itoa(base + 5)}, [2]string{"--port", "--http-port"}},
		{[]string{"--port", strconv.Itoa(base), "--http-port", strconv.Itoa(base + 3), "--metadata-port", strconv.Itoa(base + 4)}, [2]string{"--http-port", "--metadata-port"}},
		{[]string{"--port", strconv.Itoa(base), "--http-port", "0", "--metadata-port", strconv.Itoa(base + 1)}, [2]string{"--port", "--metadata-port"}},
	} {
		cmd := standaloneCommand()
		dataDir := filepath.Join(t.TempDir(), "data")
		cmd.SetArgs(append([]string{"--data-dir", dataDir, "--bookies", "3", "--write-cache-mb", "16"}, tc.args...))
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // if it serves, it stops
		err := cmd.ExecuteContext(ctx)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want[0]+" and "+tc.want[1]) {
			t.Errorf("standalone --bookies 3 %v: %v, want an error naming %s and %s", tc.args, err, tc.want[0], tc.want[1])
		}
		if _, serr := os.Stat(dataDir); !os.IsNotExist(serr) {
			t.Errorf("standalone %v: refused (%v), but it created %s", tc.args, err, dataDir)
		}
	}
}

// TestStandaloneRefusesFewerBookiesThanItsDataDirHolds: restarted on a data dir with fewer
// --bookies than it holds bookie dirs, standalone refuses, naming the dirs it would leave
// out (their entries may be the only copies), and starts nothing.
func TestStandaloneRefusesFewerBookiesThanItsDataDirHolds(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	for _, b := range []string{"bookie-0", "bookie-1", "bookie-2", "bookie-3"} {
		if err := os.MkdirAll(filepath.Join(dataDir, b, "journal"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := standaloneCommand()
	cmd.SetArgs([]string{"--data-dir", dataDir, "--bookies", "2", "--port", strconv.Itoa(freePorts(t, 2)),
		"--metadata-port", strconv.Itoa(freePorts(t, 1)), "--http-port", "0"})
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // if it serves, it stops
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	if err == nil || !strings.Contains(err.Error(), "bookie-2") || !strings.Contains(err.Error(), "bookie-3") ||
		!strings.Contains(err.Error(), "--bookies") {
		t.Fatalf("standalone --bookies 2 on a data dir of 4 bookies: %v, want a refusal naming bookie-2, bookie-3 and --bookies", err)
	}
	if _, serr := os.Stat(filepath.Join(dataDir, "metadata")); !os.IsNotExist(serr) {
		t.Errorf("refused (%v), but it started etcd in %s", err, dataDir)
	}
}

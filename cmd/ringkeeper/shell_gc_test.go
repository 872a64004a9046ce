package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestShellGC runs each `shell gc` subcommand against a fake admin API and checks the request
// it sends and that it prints the answer.
func TestShellGC(t *testing.T) {
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got = append(got, r.Method+" "+r.URL.Path+" "+string(body))
		if r.URL.Path == "/api/v1/bookie/gc/resume_compaction" {
			http.Error(w, "no", http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"ok": true})
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	for _, tc := range []struct {
		args []string
		want string
		fail bool
	}{
		{[]string{"trigger", "--major"}, `PUT /api/v1/bookie/gc {"forceMajor":true,"forceMinor":false}`, false},
		{[]string{"status"}, `GET /api/v1/bookie/gc_details `, false},
		{[]string{"suspend", "--minor"}, `PUT /api/v1/bookie/gc/suspend_compaction {"suspendMajor":false,"suspendMinor":true}`, false},
		{[]string{"resume"}, `PUT /api/v1/bookie/gc/resume_compaction {"resumeMajor":true,"resumeMinor":true}`, true},
	} {
		got = nil
		cmd := shellCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(append([]string{"gc", "--bookie-http", addr}, tc.args...))
		err := cmd.Execute()
		if (err != nil) != tc.fail {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if len(got) != 1 || got[0] != tc.want {
			t.Fatalf("%v sent %q, want %q", tc.args, got, tc.want)
		}
		if !tc.fail && !strings.Contains(out.String(), `"ok": true`) {
			t.Fatalf("%v printed %q", tc.args, out.String())
		}
	}
}

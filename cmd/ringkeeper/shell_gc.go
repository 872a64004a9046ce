package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// shellGCCommand returns `ringkeeper shell gc`: garbage collection and compaction of a bookie's
// entry logs, through the bookie's admin HTTP API.
func shellGCCommand() *cobra.Command {
	var addr string
	cmd := commandGroup(&cobra.Command{
		Use:   "gc",
		Short: "Garbage collection and compaction of a bookie's entry logs",
		Long: `Drives a bookie's garbage collector through its admin HTTP API (served on
prometheusStatsHttpPort unless the bookie has httpServerEnabled=false): trigger a run, show its
state, suspend or resume compaction.`,
	})
	cmd.PersistentFlags().StringVar(&addr, "bookie-http", "127.0.0.1:8000", "the bookie's admin HTTP address (host:port)")

	var major, minor bool
	trigger := &cobra.Command{
		Use:   "trigger",
		Short: "Run garbage collection now (with --major or --minor: that compaction, whatever its interval)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return adminCall(cmd.Context(), cmd.OutOrStdout(), "PUT", addr, "/api/v1/bookie/gc",
				map[string]bool{"forceMajor": major, "forceMinor": minor})
		},
	}
	trigger.Flags().BoolVar(&major, "major", false, "force a major compaction")
	trigger.Flags().BoolVar(&minor, "minor", false, "force a minor compaction")

	status := &cobra.Command{
		Use:   "status",
		Short: "Show the garbage collector's state: last runs, reclaimed bytes, each entry log's live share",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return adminCall(cmd.Context(), cmd.OutOrStdout(), "GET", addr, "/api/v1/bookie/gc_details", nil)
		},
	}

	suspendResume := func(verb string) *cobra.Command {
		var major, minor bool
		c := &cobra.Command{
			Use:   verb,
			Short: strings.ToUpper(verb[:1]) + verb[1:] + " compaction (major and minor unless --major or --minor)",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if !major && !minor {
					major, minor = true, true
				}
				return adminCall(cmd.Context(), cmd.OutOrStdout(), "PUT", addr, "/api/v1/bookie/gc/"+verb+"_compaction",
					map[string]bool{verb + "Major": major, verb + "Minor": minor})
			},
		}
		c.Flags().BoolVar(&major, "major", false, verb+" major compaction")
		c.Flags().BoolVar(&minor, "minor", false, verb+" minor compaction")
		return c
	}
	cmd.AddCommand(trigger, status, suspendResume("suspend"), suspendResume("resume"))
	return cmd
}

// adminCall sends one admin request (body as JSON when not nil) and prints the JSON answer
// indented.
func adminCall(ctx context.Context, out io.Writer, method, addr, path string, body any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rd)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%s %s: %s (is the bookie's admin API off, httpServerEnabled=false?)", method, path, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, data, "", "  ") != nil {
		_, err = out.Write(data)
		return err
	}
	pretty.WriteByte('\n')
	_, err = out.Write(pretty.Bytes())
	return err
}

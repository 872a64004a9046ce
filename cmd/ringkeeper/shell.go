package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// shellCommand returns `ringkeeper shell`, the parent of the admin and inspection commands
// (BookKeeper's `bookkeeper shell`). Command groups add themselves here.
func shellCommand() *cobra.Command {
	cmd := commandGroup(&cobra.Command{
		Use:   "shell",
		Short: "Admin and inspection commands",
	})
	cmd.AddCommand(shellGCCommand(), shellLedgerCommand(), shellBookiesCommand())
	return cmd
}

// commandGroup makes cmd, a parent of subcommands, refuse an unknown subcommand. Cobra runs a
// parent that has no Run for any word it does not know and prints its help with exit status
// 0, so a script's typo (`shell ledger dleete 5`) read as success. Alone, the parent still
// prints its help.
func commandGroup(cmd *cobra.Command) *cobra.Command {
	cmd.Args = unknownSubcommand
	cmd.SuggestionsMinimumDistance = 2 // cobra's default, which SuggestionsFor does not apply
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	return cmd
}

// unknownSubcommand refuses any argument: it can only be a subcommand that does not exist.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return fmt.Errorf("%s (see %s --help)", msg, cmd.CommandPath())
}

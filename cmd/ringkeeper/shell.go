package main

import "github.com/spf13/cobra"

// shellCommand returns `ringkeeper shell`, the parent of the admin and inspection commands
// (BookKeeper's `bookkeeper shell`). Command groups add themselves here.
func shellCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "shell",
		Short: "Admin and inspection commands",
	}
	cmd.AddCommand(shellGCCommand(), shellLedgerCommand(), shellBookiesCommand())
	return cmd
}

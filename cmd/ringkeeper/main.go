// Command ringkeeper is the single binary: bookie, standalone, bench and shell.
package main

func main() {}

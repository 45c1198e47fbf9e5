//go:build !unix

package main

// openFileLimit is a conservative guess where the limit cannot be read.
func openFileLimit() int { return 2048 }

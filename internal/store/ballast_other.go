//go:build !linux

package store

import "os"

// allocate is fallocate(2) on Linux; elsewhere the ballast is written.
func allocate(*os.File, int64) error { return errAllocateUnsupported }

package httpapi

import "time"

// SetScanReleaseAfterDefault makes d the default of Server.ScanReleaseAfter
// for the streams opened until restore is called (nodes made by package
// node leave the field 0). Tests that use it must not run in parallel.
func SetScanReleaseAfterDefault(d time.Duration) (restore func()) {
	old := scanReleaseAfterDefault
	scanReleaseAfterDefault = d
	return func() { scanReleaseAfterDefault = old }
}

// SetRawValueMinBytes sets the size from which GET answers reference the
// value instead of copying it (0: always copy) until restore is called.
// Tests that use it must not run in parallel.
func SetRawValueMinBytes(n int) (restore func()) {
	old := rawValueMinBytes
	rawValueMinBytes = n
	return func() { rawValueMinBytes = old }
}

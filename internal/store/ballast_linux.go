package store

import (
	"errors"
	"os"
	"syscall"
)

// allocate gives f n bytes of allocated blocks and that size
// (fallocate(2), mode 0), or errAllocateUnsupported where the file
// system cannot.
func allocate(f *os.File, n int64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, n)
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return errAllocateUnsupported
	}
	return err
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// setProcessGroup puts a child in its own process group so that killing the
// group also kills anything it spawned, and so the terminal's Ctrl-C reaches
// only the driver, which then tears children down in order. Pdeathsig is the
// backstop for when the driver itself is killed with SIGKILL.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroupOnCancel makes a CommandContext child take its whole process group
// down when the context ends, not just its leader.
func killGroupOnCancel(cmd *exec.Cmd) {
	cmd.Cancel = func() error { return killGroup(cmd, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
}

func killGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}

// Proc is a long-running server child.
type Proc struct {
	Name    string
	Command string // shell-quoted, for the report
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// PID is the process's id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Stop asks the process group to terminate and kills it after grace, so a
// server that hangs in shutdown cannot hang the benchmark.
func (p *Proc) Stop(grace time.Duration) {
	if done, _ := p.Exited(); done {
		return
	}
	_ = killGroup(p.cmd, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		slog.Warn("server did not stop in time; killing", "name", p.Name, "grace", grace)
		_ = killGroup(p.cmd, syscall.SIGKILL)
		<-p.done
	}
	// Anything the server left behind in its group goes too.
	_ = killGroup(p.cmd, syscall.SIGKILL)
}

// Procs tracks every server child, so that all of them are stopped on any
// exit path, including Ctrl-C.
type Procs struct {
	mu   sync.Mutex
	list []*Proc
}

// Start launches bin with args as launch says (pinned to cores or not),
// stdout and stderr appended to logPath.
func (ps *Procs) Start(name, bin, displayBin string, args []string, logPath string, launch Launch) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log for %s: %w", name, err)
	}
	path, argv, env := launch.Command(bin, args)
	cmd := exec.Command(path, argv...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	setProcessGroup(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{
		Name:    name,
		Command: launch.Display(displayBin, args),
		LogPath: logPath,
		cmd:     cmd,
		done:    make(chan struct{}),
	}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	slog.Info("started", "name", name, "pid", cmd.Process.Pid, "cores", formatCPUList(launch.Cores), "log", logPath)
	return p, nil
}

// StopAll stops every process started and not yet stopped, concurrently so a
// cluster's shutdown costs one grace period, not three.
func (ps *Procs) StopAll() {
	ps.mu.Lock()
	list := ps.list
	ps.list = nil
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range list {
		wg.Go(func() { p.Stop(10 * time.Second) })
	}
	wg.Wait()
}

// freePorts reserves n distinct free loopback ports. All listeners are held
// until every port is chosen so the kernel cannot hand out one port twice;
// the small race with other programs after closing is accepted.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserve a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitReady polls url until it answers with want (or with any HTTP status if
// want is 0), the process exits, or timeout passes.
func waitReady(ctx context.Context, p *Proc, url string, want int, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(timeout)
	var last string
	for {
		if done, err := p.Exited(); done {
			return fmt.Errorf("%s exited before becoming ready (%v); log %s: %s", p.Name, err, p.LogPath, tailFile(p.LogPath, 10))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("readiness probe for %s: %w", p.Name, err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if want == 0 || resp.StatusCode == want {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready at %s after %s (last: %s); log %s", p.Name, url, timeout, last, p.LogPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// tailFile returns the last n lines of a log, for error messages.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

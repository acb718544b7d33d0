"""One memory bound for a whole sandboxed program, all its processes together
(metrics/pass_rate.lua; runs on the host, outside the sandbox, as the trainer's user).

    python3 -I pass_rate_membound.py LIMIT_BYTES auto|poll -- ARGV...

Where the machine lets this user make a memory cgroup (v2 with the memory controller
delegated, or v1's memory hierarchy writable), the program runs in a fresh one limited to
LIMIT_BYTES (swap included where the kernel counts it) and the kernel's OOM killer ends
it at the bound. Elsewhere, the resident memory of the program's process tree is summed
every 20 ms and the tree is killed past the bound (also with `poll`). Either way a program over the bound
ends with status 137 and one line on stderr; otherwise this exits with the program's status.
"""
import os
import signal
import sys
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def own_cgroup():
    """(version, directory) of this process's memory cgroup, or None."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, ctrl, path = line.split(":", 2)
        if "memory" in ctrl.split(","):
            return 1, "/sys/fs/cgroup/memory" + path
    for line in lines:
        if line.startswith("0::"):
            return 2, "/sys/fs/cgroup" + line[3:]
    return None


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def make_cgroup(limit):
    """A fresh memory cgroup limited to limit bytes: (version, dir), or None where none can be made."""
    found = own_cgroup()
    if not found:
        return None
    version, base = found
    name = "clrt-pass-rate-%d-%d" % (os.getpid(), time.monotonic_ns() % 1000000)
    for parent in (base, "/sys/fs/cgroup/memory" if version == 1 else None):
        if not parent:
            continue
        d = os.path.join(parent, name)
        remove_stale(parent)
        try:
            if version == 2 and "memory" not in open(os.path.join(parent, "cgroup.subtree_control")).read().split():
                continue
            os.mkdir(d)
        except OSError:
            continue
        try:
            if version == 1:
                write(d + "/memory.limit_in_bytes", str(limit))
                if os.path.exists(d + "/memory.memsw.limit_in_bytes"):
                    try:
                        write(d + "/memory.memsw.limit_in_bytes", str(limit))
                    except OSError:
                        pass
            else:
                write(d + "/memory.max", str(limit))
                if os.path.exists(d + "/memory.swap.max"):
                    write(d + "/memory.swap.max", "0")
            return version, d
        except OSError:
            remove_cgroup((version, d))
    return None


def cgroup_pids(cg):
    try:
        return [int(p) for p in open(cg[1] + "/cgroup.procs").read().split()]
    except OSError:
        return []


def remove_cgroup(cg):
    for _ in range(200):   # the kernel frees the group once its last process is reaped
        for p in cgroup_pids(cg):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(cg[1])
            return
        except OSError:
            time.sleep(0.01)


def oom_killed(cg):
    events = "/memory.oom_control" if cg[0] == 1 else "/memory.events"
    try:
        for line in open(cg[1] + events).read().splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill" and int(v) > 0:
                return True
        if cg[0] == 1:   # kernels without the oom_kill count: the limit was hit
            return int(open(cg[1] + "/memory.failcnt").read()) > 0
    except (OSError, ValueError):
        pass
    return False


def remove_stale(parent):
    """Groups left by a bound whose process was killed (the trainer's timeout) before it
    could remove its own: empty, their maker gone."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for n in names:
        if n.startswith("clrt-pass-rate-"):
            pid = n.split("-")[3]
            if pid.isdigit() and not os.path.exists("/proc/" + pid):
                try:
                    os.rmdir(os.path.join(parent, n))
                except OSError:
                    pass


def tree_rss(root):
    """Resident bytes of root and its descendants, and their pids."""
    parent, rss = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = open("/proc/%s/stat" % name).read()
            fields = stat[stat.rindex(")") + 2:].split()
            parent[int(name)] = int(fields[1])
            rss[int(name)] = int(fields[21]) * PAGE
        except (OSError, ValueError, IndexError):
            continue
    members, total = set(), 0
    for pid in rss:
        p, seen = pid, 0
        while p and p != root and seen < 64:
            p, seen = parent.get(p, 0), seen + 1
        if p == root:
            members.add(pid)
            total += rss[pid]
    return total, members


def main():
    limit = int(sys.argv[1])
    argv = sys.argv[sys.argv.index("--") + 1:]
    cg = make_cgroup(limit) if sys.argv[2] == "auto" else None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)   # joined the cgroup (or there is none) before anything runs
        os.close(r)
        try:
            os.execvp(argv[0], argv)
        except OSError as e:
            os.write(2, ("pass_rate: cannot start %s: %s\n" % (argv[0], e)).encode())
            os._exit(127)
    os.close(r)
    if cg:
        try:
            write(cg[1] + "/cgroup.procs", str(pid))
        except OSError:
            remove_cgroup(cg)
            cg = None
    os.write(w, b"x")
    os.close(w)
    over = False
    while True:
        done, status = os.waitpid(pid, 0 if cg else os.WNOHANG)
        if done:
            break
        total, members = tree_rss(pid)
        if total > limit:
            over = True
            for p in [pid] + sorted(members):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
            os.waitpid(pid, 0)
            status = 9
            break
        time.sleep(0.02)
    if cg:
        over = oom_killed(cg)
        remove_cgroup(cg)
    if over:
        os.write(2, ("pass_rate: the program passed its memory bound of %d MB (all its processes together)\n"
                     % (limit // 1048576)).encode())
        sys.exit(137)
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()

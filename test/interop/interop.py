#!/usr/bin/env python3
"""Wire interop: the library's examples against a peer written directly on libfabric.

Four directions, each in processes of their own on 127.0.0.1:
  write-to-peer   async_transfer (library) writes into fabric_peer target
  read-from-peer  read_from_peer (library) reads from fabric_peer target --read
  peer-writes     fabric_peer write into one_target (library)
  peer-reads      fabric_peer read from one_target --read (library)

  interop.py --examples DIR --peer PATH [--peer-env K=V ...] [--library-env K=V ...]
             [--library-config TOML] [--expect-refusal TEXT] [--only DIRECTION ...]

The peer may be linked against another libfabric than the library (CI pairs every version).
With --expect-refusal, the library's initiators must fail, and say TEXT in their error, instead of
transferring: a pairing that cannot work. Prints one line per direction and "N passed, N failed";
exits 1 on any failure. Every process is ended by its PID; every wait is bounded.
"""
import argparse
import os
import subprocess
import sys
import time

STEP_TIMEOUT = 30.0  # seconds; a transfer on an idle machine takes well under 1 s
# A refused pairing fails within the library's progress_deadline (1 s by default) of its first
# post; the bound adds process start and libfabric's initialisation, with a wide margin.
REFUSAL_BOUND = 10.0


class Process:
    def __init__(self, argv, env):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                     stdin=subprocess.DEVNULL, text=True)
        self.lines = []

    def wait_line(self, prefix, timeout=STEP_TIMEOUT):
        """Reads stdout until a line starting with prefix; None at EOF or after timeout."""
        deadline = time.monotonic() + timeout
        import select
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self.proc.stdout.readline()
            if not line:
                return None
            self.lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                return line.rstrip("\n")
        return None

    def finish(self, timeout=STEP_TIMEOUT, end=False):
        """Waits for the exit (or ends the process by its PID first); returns (code, stdout, stderr)."""
        if end and self.proc.poll() is None:
            self.proc.terminate()
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        return self.proc.returncode, "\n".join(self.lines + out.splitlines()), err


def environment(pairs):
    env = dict(os.environ)
    for pair in pairs:
        key, _, value = pair.partition("=")
        env[key] = value
    return env


def run_direction(name, target_argv, target_env, initiator_argv, initiator_env, initiator_ok, target_ok,
                  end_target, refusal):
    target = Process(target_argv, target_env)
    advertisement = target.wait_line("advertisement: ")
    if advertisement is None:
        code, out, err = target.finish(end=True)
        return False, f"the target printed no advertisement (exit {code})\n{out}\n{err}"
    fields = advertisement.split()[1:]
    started = time.monotonic()
    initiator = Process(initiator_argv + fields, initiator_env)
    i_code, i_out, i_err = initiator.finish(timeout=STEP_TIMEOUT)
    took = time.monotonic() - started
    t_code, t_out, t_err = target.finish(end=end_target or refusal is not None)
    report = (f"initiator {' '.join(initiator_argv[:2])}: exit {i_code} in {took:.2f} s\n{i_out}\n{i_err}\n"
              f"target {' '.join(target_argv[:2])}: exit {t_code}\n{t_out}\n{t_err}")
    if refusal is not None:
        text = i_out + i_err
        return (refusal in text and "transfer failed" in text and took < REFUSAL_BOUND), report
    return initiator_ok(i_code, i_out) and target_ok(t_code, t_out), report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", required=True)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--peer-env", action="append", default=[])
    parser.add_argument("--library-env", action="append", default=[])
    parser.add_argument("--library-config", default=None,
                        help="TOML text of a [dma-libfabric] table the examples load with --config")
    parser.add_argument("--expect-refusal", default=None,
                        help="the library's initiators must fail with this text instead of transferring")
    parser.add_argument("--only", action="append", default=[], help="run only these directions")
    args = parser.parse_args()

    config_args = []
    if args.library_config is not None:
        import tempfile
        config = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        config.write("[dma-libfabric]\n" + args.library_config.replace("\\n", "\n") + "\n")
        config.close()
        config_args = ["--config", config.name]
    ex = lambda name: [os.path.join(args.examples, name)] + config_args
    peer_env = environment(args.peer_env)
    library_env = environment(args.library_env)
    bind = "127.0.0.1"
    directions = [
        ("write-to-peer", [args.peer, "target", bind], peer_env, ex("async_transfer") + [bind], library_env,
         lambda c, o: c == 0 and "wrote 4096 of 4096 bytes" in o,
         lambda c, o: c == 0 and "payload verified" in o, False),
        ("read-from-peer", [args.peer, "target", "--read", bind], peer_env, ex("read_from_peer") + [bind],
         library_env, lambda c, o: c == 0 and "payload verified" in o, lambda c, o: True, True),
        ("peer-writes", ex("one_target") + [bind], library_env, [args.peer, "write"], peer_env,
         lambda c, o: c == 0 and "wrote 4096 bytes" in o,
         lambda c, o: c == 0 and "payload verified" in o, False),
        ("peer-reads", ex("one_target") + ["--read", bind], library_env, [args.peer, "read"], peer_env,
         lambda c, o: c == 0 and "payload verified" in o, lambda c, o: True, True),
    ]
    if args.expect_refusal is not None:
        directions = [d for d in directions if d[0] in ("write-to-peer", "read-from-peer")]
    if args.only:
        directions = [d for d in directions if d[0] in args.only]

    passed = failed = 0
    for name, t_argv, t_env, i_argv, i_env, i_ok, t_ok, end_target in directions:
        ok, report = run_direction(name, t_argv, t_env, i_argv, i_env, i_ok, t_ok, end_target, args.expect_refusal)
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
        if not ok:
            print("  " + report.replace("\n", "\n  "))
        passed += ok
        failed += not ok
    if config_args:
        os.unlink(config_args[1])
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

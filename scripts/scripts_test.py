#!/usr/bin/env python3
"""Tests of the benchmark scripts against a fake `ringkeeper` binary (no bookie, no disk load):

    python3 -m unittest discover -s scripts -p 'scripts_test.py'
"""
import json, os, socket, subprocess, sys, tempfile, textwrap, unittest

HERE = os.path.dirname(os.path.abspath(__file__))

# A fake `ringkeeper standalone`: records its argv, serves the v2 add/read frames of
# slow-client-flood.py on --port, answering the probe (ledger 7) and dropping the flood.
FAKE_STANDALONE = textwrap.dedent('''\
    #!/usr/bin/env python3
    import os, signal, socket, struct, sys, threading
    argv = sys.argv[1:]
    open(os.environ["FAKE_ARGV"], "w").write("\\n".join(argv))
    port = int(argv[argv.index("--port") + 1])
    def exact(c, n):
        b = b""
        while len(b) < n:
            chunk = c.recv(n - len(b))
            if not chunk:
                raise ConnectionError
            b += chunk
        return b
    def serve(c):
        try:
            while True:
                n = struct.unpack(">i", exact(c, 4))[0]
                body = exact(c, n)
                op = body[1]
                ledger = struct.unpack(">q", body[24:32] if op == 1 else body[4:12])[0]
                if ledger == 7:
                    c.sendall(struct.pack(">ii", 8, struct.unpack(">i", body[:4])[0]) + b"\\0\\0\\0\\0")
        except OSError:
            pass
    ln = socket.create_server(("127.0.0.1", port))
    def stop(*_):
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ringkeeper standalone ready", flush=True)
    while True:
        c, _ = ln.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
''')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlowClientFlood(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.binary = os.path.join(self.tmp.name, "ringkeeper")
        with open(self.binary, "w") as f:
            f.write(FAKE_STANDALONE)
        os.chmod(self.binary, 0o755)
        self.env = dict(os.environ, FAKE_ARGV=os.path.join(self.tmp.name, "argv"))

    def tearDown(self):
        self.tmp.cleanup()

    def flood(self, *extra):
        return subprocess.run([sys.executable, os.path.join(HERE, "slow-client-flood.py"), "--binary", self.binary,
                               "--dir", self.tmp.name, "--port", str(free_port()), *extra],
                              capture_output=True, text=True, env=self.env, timeout=120)

    def test_cache_sizes_are_the_bookies(self):
        """The limit is computed from cache sizes the bookie really runs with: a --read-cache-mb
        or --index-cache-mb that never reached the bookie only moved the limit."""
        p = self.flood("--clients", "1", "--seconds", "1", "--read-cache-mb", "64", "--index-cache-mb", "4096")
        argv = []
        if os.path.exists(self.env["FAKE_ARGV"]):  # not started when the flags are refused
            with open(self.env["FAKE_ARGV"]) as f:
                argv = f.read().split("\n")
        passed = "64" in argv and "4096" in argv
        self.assertTrue(passed or (p.returncode != 0 and "limit" not in p.stdout),
                        f"rc {p.returncode}, bookie argv {argv}, report {p.stdout}")

    def test_limit_is_the_standalone_bookies_caches(self):
        p = self.flood("--clients", "1", "--seconds", "1", "--write-cache-mb", "100")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("(write cache 100 + read cache 256 + index cache 128 + 256) 740 MiB", p.stdout)


# A fake binary for bench-figures.py: every `bench` prints a result; `standalone` fails to start.
FAKE_FIGURES = textwrap.dedent('''\
    #!/usr/bin/env python3
    import json, sys
    if sys.argv[1] == "standalone":
        sys.exit("ringkeeper: metadata port 23790 is in use")
    print(json.dumps({"ops_per_sec": 1000.0}))
''')


class BenchFigures(unittest.TestCase):
    def test_a_bookie_that_did_not_start_is_recorded(self):
        """A repetition whose separate bookie did not start is in figures.json as an error, as
        any failed run is: it was left out, so a median was silently of fewer runs."""
        with tempfile.TemporaryDirectory() as tmp:
            binary = os.path.join(tmp, "ringkeeper")
            with open(binary, "w") as f:
                f.write(FAKE_FIGURES)
            os.chmod(binary, 0o755)
            fakebin = os.path.join(tmp, "bin")
            os.mkdir(fakebin)
            with open(os.path.join(fakebin, "go"), "w") as f:  # no Go benchmarks here
                f.write("#!/bin/sh\necho ok\n")
            os.chmod(os.path.join(fakebin, "go"), 0o755)
            out = os.path.join(tmp, "out")
            env = dict(os.environ, PATH=fakebin + os.pathsep + os.environ["PATH"])
            p = subprocess.run([sys.executable, os.path.join(HERE, "bench-figures.py"), "--dir", os.path.join(tmp, "d"),
                                "--binary", binary, "--out", out, "--reps", "1", "--only", "server"],
                               capture_output=True, text=True, env=env, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(out, "figures.json")) as f:
                figures = json.load(f)
            runs = figures.get("server-separate-raw-64conns", [])
            self.assertEqual(len(runs), 1, figures.keys())
            self.assertIn("error", runs[0])


# A fake binary for bench-journal.py: every run prints a journal result with 3 failed appends.
FAKE_JOURNAL = textwrap.dedent('''\
    #!/usr/bin/env python3
    import json
    print(json.dumps({"ops_per_sec": 1000.0, "mb_per_sec": 1.0, "errors": 3,
                      "latency_us": {"p50": 100.0, "p99": 200.0}}))
''')

FAKE_PHYSLIMIT = textwrap.dedent('''\
    #!/bin/sh
    echo '{"sync4k": {"ops_per_sec": 1, "mb_per_sec": 1, "p50_us": 50, "p99_us": 60}, "sync1m": {"ops_per_sec": 1, "mb_per_sec": 100, "p50_us": 1, "p99_us": 1}, "seq1m": {"ops_per_sec": 1, "mb_per_sec": 200, "p50_us": 1, "p99_us": 1}}'
''')


class BenchJournal(unittest.TestCase):
    def test_errors_are_reported(self):
        """A figure whose runs had failed appends says so: the errors were dropped, and the
        median of runs that failed read like any other."""
        with tempfile.TemporaryDirectory() as tmp:
            # bench-journal.py finds physlimit at ../../shared/tools from its own directory.
            scripts = os.path.join(tmp, "repo", "scripts")
            tools = os.path.join(tmp, "shared", "tools")
            os.makedirs(scripts)
            os.makedirs(tools)
            with open(os.path.join(HERE, "bench-journal.py")) as f, open(os.path.join(scripts, "bench-journal.py"), "w") as g:
                g.write(f.read())
            for path, text in ((os.path.join(tools, "physlimit"), FAKE_PHYSLIMIT), (os.path.join(tmp, "ringkeeper"), FAKE_JOURNAL)):
                with open(path, "w") as f:
                    f.write(text)
                os.chmod(path, 0o755)
            p = subprocess.run([sys.executable, os.path.join(scripts, "bench-journal.py"), "--dir", tmp, "--reps", "1",
                                "--binary", os.path.join(tmp, "ringkeeper"), "--only", "lat-psync-reuse"],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            line = [l for l in p.stdout.splitlines() if l.startswith("lat-psync-reuse")]
            self.assertEqual(len(line), 1, p.stdout)
            self.assertIn("errors 3", line[0])


if __name__ == "__main__":
    unittest.main()

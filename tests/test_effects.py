"""Effect derivation from bash: a table-driven corpus plus parse summaries.

See docs/decisions.md, Effects and policy.
"""

from __future__ import annotations

import gc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal_mcp.kernel.effects.analyzer import (
    MAX_LIST,
    SHELL_BUILTINS,
    Analysis,
    analyze,
    parse_summary,
)

CWD = "/work/proj"
HOME = "/home/u"

R, C, IRR = "reversible", "conditional", "irreversible"

_FUZZ_PIECES = [
    *"abc -~/$(){}[]<>|&;'\"`\\\n=*?.!#",
    "rm ",
    "cd ",
    "git ",
    "curl ",
    "export ",
    "for i in ",
    "do ",
    "done",
    "<<EOF\n",
    "EOF\n",
    "sudo ",
    "env ",
    "-exec ",
    "$(",
    "${",
    "tar ",
    "cp -r ",
    "ssh ",
    "sed -i ",
    "xargs ",
    "-o ",
    "http://",
    "git@h:",
    "if ",
    "then ",
    "fi",
    "f() {",
    "}",
    "--",
    "-C ",
    "\udcff",
]


def _eff(spec: str) -> tuple[str, str]:
    kind, _, target = spec.partition(" ")
    return kind, target


# (src, reversibility, effects, exact): with exact=False the effects must be a subset,
# with exact=True they must be the whole list, in order.
CORPUS: list[tuple[str, str, list[str], bool]] = [
    # --- simple reads --------------------------------------------------------------------
    ("ls", R, ["proc_spawn ls", "fs_read /work/proj"], True),
    ("ls -la /etc", R, ["proc_spawn ls", "fs_read /etc"], True),
    ("/usr/bin/ls -la", R, ["proc_spawn /usr/bin/ls", "fs_read /work/proj"], True),
    ("ls -R src", R, ["proc_spawn ls", "fs_read /work/proj/src/**"], True),
    (
        "cat a.txt b.txt",
        R,
        ["proc_spawn cat", "fs_read /work/proj/a.txt", "fs_read /work/proj/b.txt"],
        True,
    ),
    (
        "cat ../x ./y /a//b/../c",
        R,
        ["fs_read /work/x", "fs_read /work/proj/y", "fs_read /a/c"],
        False,
    ),
    ("head -n 5 a b", R, ["proc_spawn head", "fs_read /work/proj/a", "fs_read /work/proj/b"], True),
    ("tail -f /var/log/syslog", R, ["fs_read /var/log/syslog"], False),
    ("wc -l *.py", R, ["proc_spawn wc", "fs_read /work/proj/*.py"], True),
    ("grep -n TODO main.py", R, ["proc_spawn grep", "fs_read /work/proj/main.py"], True),
    ("grep -rn foo", R, ["proc_spawn grep", "fs_read /work/proj/**"], True),
    ("grep -e pat -e other file", R, ["fs_read /work/proj/file"], False),
    (
        "rg TODO src tests",
        R,
        ["proc_spawn rg", "fs_read /work/proj/src/**", "fs_read /work/proj/tests/**"],
        True,
    ),
    ("rg -g '*.py' needle", R, ["proc_spawn rg", "fs_read /work/proj/**"], True),
    ("diff -u a.txt b.txt", R, ["fs_read /work/proj/a.txt", "fs_read /work/proj/b.txt"], False),
    ("stat -c %s file", R, ["proc_spawn stat", "fs_read /work/proj/file"], True),
    ("find . -name '*.py'", R, ["proc_spawn find", "fs_read /work/proj/**"], True),
    ("find /etc -type f", R, ["fs_read /etc/**"], False),
    (
        "sort data.csv | uniq -c | sort -rn | head",
        R,
        ["proc_spawn sort", "fs_read /work/proj/data.csv", "proc_spawn uniq", "proc_spawn head"],
        True,
    ),
    ("less README.md", R, ["fs_read /work/proj/README.md"], False),
    ("jq '.name' package.json", R, ["proc_spawn jq", "fs_read /work/proj/package.json"], True),
    ("ls ~", R, ["fs_read /home/u"], False),
    ("cat ~/notes.txt", R, ["fs_read /home/u/notes.txt"], False),
    ("cat $HOME/.bashrc", R, ["env_read HOME", "fs_read /home/u/.bashrc"], False),
    ("echo hello", R, ["proc_spawn echo"], True),
    ("pwd; whoami; date", R, ["proc_spawn pwd", "proc_spawn whoami", "proc_spawn date"], True),
    ("git status", R, ["proc_spawn git", "fs_read /work/proj/**"], True),
    ("git log --oneline -n 5 && git diff HEAD~1", R, ["fs_read /work/proj/**"], False),
    ("git -C /repo branch", R, ["proc_spawn git", "fs_read /repo/**"], True),
    ("pip list", R, ["proc_spawn pip"], True),
    # --- redirections --------------------------------------------------------------------
    ("echo hi > out.txt", C, ["proc_spawn echo", "fs_write /work/proj/out.txt"], True),
    ("echo hi >> /tmp/log", C, ["fs_write /tmp/log"], False),
    ("make &> build.log", C, ["proc_spawn make", "fs_write /work/proj/build.log"], True),
    ("cmd 2> err.txt", C, ["fs_write /work/proj/err.txt"], False),
    (
        "sort < in.txt > out.txt",
        C,
        ["fs_read /work/proj/in.txt", "fs_write /work/proj/out.txt"],
        False,
    ),
    ("echo hi > /dev/null 2>&1", R, ["proc_spawn echo"], True),
    ("ls >&2", R, ["proc_spawn ls", "fs_read /work/proj"], True),
    ("echo x >| forced", C, ["fs_write /work/proj/forced"], False),
    ("exec > log.txt 2>&1", C, ["proc_spawn exec", "fs_write /work/proj/log.txt"], True),
    ("echo x > $OUT", IRR, ["env_read OUT", "opaque dynamic path: redirect"], False),
    # --- here-docs and here-strings ------------------------------------------------------
    (
        "cat <<EOF > notes.md\nhello $USER\nEOF",
        C,
        ["proc_spawn cat", "fs_write /work/proj/notes.md", "env_read USER"],
        True,
    ),
    ("cat <<'EOF'\n$NOT_A_VAR\nEOF", R, ["proc_spawn cat"], True),
    ("cat <<EOF\n$(rm -rf /tmp/x)\nEOF", IRR, ["proc_spawn rm", "fs_delete /tmp/x/**"], False),
    ('grep foo <<< "$DATA"', R, ["proc_spawn grep", "env_read DATA"], True),
    (
        "cat <<EOF | sh\nrm -rf /\nEOF",
        IRR,
        ["proc_spawn sh", "opaque sh reading a script from stdin"],
        False,
    ),
    # --- pipelines, lists, groups --------------------------------------------------------
    (
        "cat a | grep b | wc -l",
        R,
        ["proc_spawn cat", "fs_read /work/proj/a", "proc_spawn grep", "proc_spawn wc"],
        True,
    ),
    ("make && make test || echo failed", C, ["proc_spawn make", "proc_spawn echo"], True),
    ("true; false; :", R, ["proc_spawn true", "proc_spawn false", "proc_spawn :"], True),
    ("(cd sub && ls)", C, ["session_write cwd", "fs_read /work/proj/sub"], False),
    ("(cd sub); ls", C, ["fs_read /work/proj"], False),
    (
        "{ ls; cat f; } > all.txt",
        C,
        ["fs_read /work/proj", "fs_read /work/proj/f", "fs_write /work/proj/all.txt"],
        False,
    ),
    ("! grep -q x f", R, ["proc_spawn grep", "fs_read /work/proj/f"], True),
    ("sleep 10 &", R, ["proc_spawn sleep"], True),
    (
        "diff <(sort a) <(sort b)",
        R,
        ["proc_spawn sort", "fs_read /work/proj/a", "fs_read /work/proj/b", "proc_spawn diff"],
        True,
    ),
    ("a && b && c && d && e", C, ["proc_spawn a", "proc_spawn e"], False),
    # --- control flow and functions ------------------------------------------------------
    (
        "if [ -f x ]; then cat x; else echo none; fi",
        R,
        ["proc_spawn cat", "fs_read /work/proj/x", "proc_spawn echo"],
        True,
    ),
    (
        'for f in a b; do rm "$f"; done',
        IRR,
        ["proc_spawn rm", "fs_delete /work/proj/a", "fs_delete /work/proj/b"],
        True,
    ),
    ('for f in *.log; do gzip "$f"; done', IRR, ["fs_read /work/proj/*.log"], False),
    (
        'while read line; do echo "$line"; done < list.txt',
        R,
        ["proc_spawn read", "proc_spawn echo", "fs_read /work/proj/list.txt"],
        True,
    ),
    (
        "case $1 in start) ./run.sh ;; *) echo usage ;; esac",
        C,
        ["proc_spawn ./run.sh", "proc_spawn echo"],
        True,
    ),
    ("f() { rm -f tmp.txt; }; f", IRR, ["proc_spawn rm", "fs_delete /work/proj/tmp.txt"], True),
    ("if true; then cd sub; fi; ls", IRR, ["opaque relative path in unknown cwd: ls"], False),
    ("for i in $(seq 3); do echo $i; done", R, ["proc_spawn seq", "proc_spawn echo"], True),
    # --- cd, export, variables -----------------------------------------------------------
    (
        "cd /tmp && ls",
        C,
        ["proc_spawn cd", "session_write cwd", "proc_spawn ls", "fs_read /tmp"],
        True,
    ),
    ("cd && cat .profile", C, ["fs_read /home/u/.profile"], False),
    ("cd sub; cat f", C, ["fs_read /work/proj/sub/f"], False),
    (
        'cd "$DIR" && ls',
        IRR,
        ["env_read DIR", "session_write cwd", "opaque relative path in unknown cwd: ls"],
        False,
    ),
    ("export FOO=bar", C, ["env_write FOO"], True),
    ("export PATH=$HOME/bin:$PATH", C, ["env_read HOME", "env_read PATH", "env_write PATH"], True),
    ("export A B=2", C, ["env_write A", "env_write B"], True),
    ("export -p", R, ["env_read *"], True),
    ("unset FOO", C, ["env_write FOO"], True),
    ("FOO=1", C, ["env_write FOO"], True),
    ("x=1; echo $x", R, ["proc_spawn echo"], True),
    ("echo $AWS_SECRET_ACCESS_KEY", R, ["env_read AWS_SECRET_ACCESS_KEY", "proc_spawn echo"], True),
    (
        "echo ${HOME:-/root} $((N + 1)) $1 $@ $?",
        R,
        ["env_read HOME", "env_read N", "proc_spawn echo"],
        True,
    ),
    ("LC_ALL=C sort f", R, ["env_write LC_ALL", "proc_spawn sort", "fs_read /work/proj/f"], True),
    ("printenv", R, ["proc_spawn printenv", "env_read *"], True),
    ("printenv HOME", R, ["env_read HOME"], False),
    ("env", R, ["proc_spawn env", "env_read *"], True),
    ("local v=1; declare -x EXP=2", C, ["env_write EXP"], True),
    # --- wrappers ------------------------------------------------------------------------
    (
        "sudo rm -rf /var/cache/x",
        IRR,
        ["proc_spawn sudo", "proc_spawn rm", "fs_delete /var/cache/x/**"],
        True,
    ),
    (
        "sudo -u www-data cat /etc/shadow",
        R,
        ["proc_spawn sudo", "proc_spawn cat", "fs_read /etc/shadow"],
        True,
    ),
    (
        "env FOO=1 BAR=2 make -j4",
        C,
        ["proc_spawn env", "env_write FOO", "env_write BAR", "proc_spawn make"],
        True,
    ),
    ("env -C /srv ls", R, ["proc_spawn env", "proc_spawn ls", "fs_read /srv"], True),
    (
        "nice -n 10 tar czf out.tgz src",
        C,
        [
            "proc_spawn nice",
            "proc_spawn tar",
            "fs_read /work/proj/src/**",
            "fs_write /work/proj/out.tgz",
        ],
        True,
    ),
    (
        "time cat big.log",
        R,
        ["proc_spawn time", "proc_spawn cat", "fs_read /work/proj/big.log"],
        True,
    ),
    (
        "timeout 5 curl https://example.com",
        C,
        ["proc_spawn timeout", "proc_spawn curl", "net_connect example.com:443"],
        True,
    ),
    ("nohup ./server.sh &", C, ["proc_spawn nohup", "proc_spawn ./server.sh"], True),
    ("command -v git", R, ["proc_spawn command"], True),
    ("exec python3 app.py", C, ["proc_spawn exec", "proc_spawn python3"], True),
    # --- writes --------------------------------------------------------------------------
    ("touch a.txt", C, ["proc_spawn touch", "fs_write /work/proj/a.txt"], True),
    ("touch {a,b}.txt", C, ["fs_write /work/proj/a.txt", "fs_write /work/proj/b.txt"], False),
    ("mkdir -p build/out", C, ["proc_spawn mkdir", "fs_write /work/proj/build/out"], True),
    (
        "cp a.txt b.txt",
        C,
        ["proc_spawn cp", "fs_read /work/proj/a.txt", "fs_write /work/proj/b.txt"],
        True,
    ),
    ("cp -r src /tmp/backup", C, ["fs_read /work/proj/src/**", "fs_write /tmp/backup/**"], False),
    (
        "cp a b dest/",
        C,
        [
            "fs_read /work/proj/a",
            "fs_write /work/proj/dest/a",
            "fs_read /work/proj/b",
            "fs_write /work/proj/dest/b",
        ],
        False,
    ),
    (
        "mv old.txt new.txt",
        IRR,
        ["proc_spawn mv", "fs_delete /work/proj/old.txt", "fs_write /work/proj/new.txt"],
        True,
    ),
    ("cat log | tee -a out.log", C, ["proc_spawn tee", "fs_write /work/proj/out.log"], False),
    (
        "sed -i 's/a/b/g' conf.ini",
        C,
        ["proc_spawn sed", "fs_read /work/proj/conf.ini", "fs_write /work/proj/conf.ini"],
        True,
    ),
    ("sed -n 1,5p file", C, ["fs_read /work/proj/file"], False),
    ("chmod +x run.sh", C, ["proc_spawn chmod", "fs_write /work/proj/run.sh"], True),
    ("chmod -R 755 bin", C, ["fs_write /work/proj/bin/**"], False),
    ("chown -R me:me /srv/app", C, ["fs_write /srv/app/**"], False),
    ("ln -sf /opt/tool/bin/tool ~/bin/tool", C, ["fs_write /home/u/bin/tool"], False),
    (
        "sort -o sorted.txt in.txt",
        C,
        ["fs_read /work/proj/in.txt", "fs_write /work/proj/sorted.txt"],
        False,
    ),
    ("tar xzf a.tgz -C out", C, ["fs_read /work/proj/a.tgz", "fs_write /work/proj/out/**"], False),
    ("dd if=/dev/zero of=disk.img bs=1M count=1", C, ["fs_write /work/proj/disk.img"], False),
    ("unzip -l a.zip", R, ["fs_read /work/proj/a.zip"], False),
    # --- deletes -------------------------------------------------------------------------
    ("rm file.txt", IRR, ["proc_spawn rm", "fs_delete /work/proj/file.txt"], True),
    (
        "rm -rf build/ dist",
        IRR,
        ["proc_spawn rm", "fs_delete /work/proj/build/**", "fs_delete /work/proj/dist/**"],
        True,
    ),
    ("rm -rf ~/.cache/pip", IRR, ["fs_delete /home/u/.cache/pip/**"], False),
    ("rmdir empty", IRR, ["fs_delete /work/proj/empty"], False),
    (
        "find . -name '*.pyc' -delete",
        IRR,
        ["fs_read /work/proj/**", "fs_delete /work/proj/**"],
        False,
    ),
    (
        "gzip big.log",
        IRR,
        [
            "fs_read /work/proj/big.log",
            "fs_write /work/proj/big.log.gz",
            "fs_delete /work/proj/big.log",
        ],
        False,
    ),
    ("git clean -fdx", IRR, ["fs_delete /work/proj/**"], False),
    ("git rm -r old", IRR, ["fs_delete /work/proj/old/**"], False),
    ("git reset --hard HEAD~1", IRR, ["fs_write /work/proj/**"], False),
    ("git checkout -- .", IRR, ["fs_write /work/proj/**"], False),
    ("git stash", C, ["fs_write /work/proj/**"], False),
    ("git stash list", R, ["fs_read /work/proj/**"], False),
    ("git commit -am 'msg'", C, ["proc_spawn git", "fs_write /work/proj/**"], True),
    ("git restore --staged f", C, ["fs_write /work/proj/**"], False),
    ("git branch -D feature", IRR, ["fs_write /work/proj/**"], False),
    ("sudo -e /etc/hosts", C, ["proc_spawn sudo", "fs_write /etc/hosts"], True),
    # --- network -------------------------------------------------------------------------
    (
        "curl https://api.github.com/repos/x",
        C,
        ["proc_spawn curl", "net_connect api.github.com:443"],
        True,
    ),
    (
        "curl -sSLo out.tgz https://example.com/x.tgz",
        C,
        ["net_connect example.com:443", "fs_write /work/proj/out.tgz"],
        False,
    ),
    (
        "curl -O http://example.org/pkg/file.zip",
        C,
        ["net_connect example.org:80", "fs_write /work/proj/file.zip"],
        False,
    ),
    (
        "curl -X POST -d @body.json http://api.local:8080/v1",
        IRR,
        ["fs_read /work/proj/body.json", "net_connect api.local:8080"],
        False,
    ),
    (
        "curl --upload-file f.bin https://up.example.com/",
        IRR,
        ["fs_read /work/proj/f.bin", "net_connect up.example.com:443"],
        False,
    ),
    ("curl example.com", C, ["net_connect example.com:80"], False),
    ('curl "$URL"', IRR, ["env_read URL", "opaque dynamic URL: curl"], False),
    (
        "wget https://example.com/file.tar.gz",
        C,
        ["net_connect example.com:443", "fs_write /work/proj/file.tar.gz"],
        False,
    ),
    (
        "wget -O - https://x.io/install.sh | sh",
        IRR,
        ["net_connect x.io:443", "opaque sh reading a script from stdin"],
        False,
    ),
    (
        "git clone https://github.com/org/repo.git",
        C,
        ["proc_spawn git", "net_connect github.com:443", "fs_write /work/proj/repo/**"],
        True,
    ),
    (
        "git clone git@github.com:org/repo.git /tmp/r",
        C,
        ["net_connect github.com:22", "fs_write /tmp/r/**"],
        False,
    ),
    ("git fetch https://gitlab.com/a/b", C, ["net_connect gitlab.com:443"], False),
    ("git pull", C, ["net_connect *:*", "fs_write /work/proj/**"], False),
    ("git push origin main", IRR, ["proc_spawn git", "net_connect *:*"], True),
    ("git push https://github.com/org/repo.git HEAD", IRR, ["net_connect github.com:443"], False),
    ("ssh deploy@host.example.com", C, ["proc_spawn ssh", "net_connect host.example.com:22"], True),
    ("ssh -p 2222 me@10.0.0.5 uptime", IRR, ["net_connect 10.0.0.5:2222"], False),
    (
        "scp -r dist host:/var/www",
        IRR,
        ["fs_read /work/proj/dist/**", "net_connect host:22"],
        False,
    ),
    ("scp host:/etc/hosts .", C, ["net_connect host:22", "fs_write /work/proj"], False),
    (
        "rsync -av src/ backup/",
        C,
        ["fs_read /work/proj/src/**", "fs_write /work/proj/backup/**"],
        False,
    ),
    ("pip install requests", C, ["proc_spawn pip", "net_connect pypi.org:443"], False),
    (
        "pip install -r requirements.txt",
        C,
        ["fs_read /work/proj/requirements.txt", "net_connect pypi.org:443"],
        False,
    ),
    (
        "python3 -m pip install -i https://mirror.local/simple x",
        C,
        ["net_connect mirror.local:443"],
        False,
    ),
    (
        "npm install",
        C,
        [
            "proc_spawn npm",
            "net_connect registry.npmjs.org:443",
            "fs_write /work/proj/node_modules/**",
        ],
        True,
    ),
    ("npm publish", IRR, ["net_connect registry.npmjs.org:443"], False),
    # --- opaque --------------------------------------------------------------------------
    (
        "echo $(whoami)",
        IRR,
        ["proc_spawn whoami", "opaque command substitution in argv", "proc_spawn echo"],
        True,
    ),
    ('ls "$(pwd)"/x', IRR, ["proc_spawn pwd", "opaque command substitution in argv"], False),
    (
        "$(which python) script.py",
        IRR,
        ["proc_spawn which", "opaque command substitution in argv0"],
        False,
    ),
    ("`echo rm` -rf /", IRR, ["opaque command substitution in argv0"], False),
    ("x=$(date +%s)", R, ["proc_spawn date"], True),
    ("$CMD --help", IRR, ["env_read CMD", "opaque dynamic argv0"], True),
    ('eval "$SETUP"', IRR, ["env_read SETUP", "proc_spawn eval", "opaque eval"], True),
    ("bash -c 'rm -rf /'", IRR, ["proc_spawn bash", "opaque bash -c"], True),
    ('sh -c "echo hi"', IRR, ["opaque sh -c"], False),
    ("bash deploy.sh", IRR, ["fs_read /work/proj/deploy.sh", "opaque bash script"], False),
    ("ls | xargs rm", IRR, ["proc_spawn xargs", "opaque xargs", "proc_spawn rm"], False),
    ("find . -name '*.tmp' -exec rm {} \\;", IRR, ["opaque find -exec", "proc_spawn rm"], False),
    (
        "source .venv/bin/activate",
        IRR,
        ["fs_read /work/proj/.venv/bin/activate", "opaque source"],
        False,
    ),
    (". ./env.sh", IRR, ["opaque ."], False),
    ("trap 'rm -f /tmp/lock' EXIT", IRR, ["opaque trap"], False),
    ('rm "$TARGET"', IRR, ["env_read TARGET", "opaque dynamic path: rm"], False),
    ("git -c core.pager='rm -rf /' log", IRR, ["opaque git -c may run a program"], False),
    ("git frobnicate", IRR, ["opaque unknown git subcommand or alias: frobnicate"], False),
    ('echo "unterminated', IRR, ["opaque parse error"], False),
    # --- unknown programs ----------------------------------------------------------------
    ("make -j8", C, ["proc_spawn make"], True),
    (
        "./configure --prefix=/usr && make install",
        C,
        ["proc_spawn ./configure", "proc_spawn make"],
        True,
    ),
    ("pytest -q tests/", C, ["proc_spawn pytest"], True),
]


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 80


@pytest.mark.parametrize(
    ("src", "rev", "expected", "exact"), CORPUS, ids=[c[0][:40] for c in CORPUS]
)
def test_corpus(src: str, rev: str, expected: list[str], exact: bool) -> None:
    a = analyze(src, CWD, HOME)
    got = [(e["kind"], e["target"]) for e in a.effects]
    want = [_eff(s) for s in expected]
    if exact:
        assert got == want, a.effects
    else:
        missing = [w for w in want if w not in got]
        assert not missing, f"missing {missing} in {got}"
    assert a.reversibility == rev, (a.reversibility, a.reasons)


def test_effects_are_deduplicated_in_first_appearance_order() -> None:
    a = analyze("cat a; cat a; ls; cat a", CWD, HOME)
    assert a.effects == [
        {"kind": "proc_spawn", "target": "cat"},
        {"kind": "fs_read", "target": "/work/proj/a"},
        {"kind": "proc_spawn", "target": "ls"},
        {"kind": "fs_read", "target": "/work/proj"},
    ]


def test_parse_error_is_opaque_with_span() -> None:
    a = analyze("ls )", CWD, HOME)
    assert not a.parse_ok
    assert {"kind": "opaque", "target": "parse error"} in a.effects
    assert a.reversibility == IRR
    assert a.error is not None and a.error["start"] == {"row": 0, "col": 3}
    d = a.to_dict()
    assert d["parse_ok"] is False and "error" in d


def test_to_dict_omits_error_when_ok() -> None:
    a = analyze("ls", CWD, HOME)
    assert isinstance(a, Analysis)
    d = a.to_dict()
    assert "error" not in d
    assert d["reversibility"] == R and d["parse_ok"] is True


def test_reasons_name_the_deciding_effect() -> None:
    a = analyze("cat a && rm b", CWD, HOME)
    assert "fs_delete /work/proj/b" in a.reasons
    assert analyze("cat a", CWD, HOME).reasons == []


def test_without_home_tilde_is_opaque() -> None:
    a = analyze("cat ~/x", CWD, None)
    assert a.reversibility == IRR
    assert any(e["kind"] == "opaque" for e in a.effects)


def test_relative_cwd_makes_relative_paths_opaque_but_not_absolute() -> None:
    a = analyze("cat /etc/hosts", "relative", HOME)
    assert {"kind": "fs_read", "target": "/etc/hosts"} in a.effects
    assert a.reversibility == R


def test_long_and_chains_do_not_recurse() -> None:
    src = " && ".join(f"echo {i}" for i in range(3000))
    a = analyze(src, CWD, HOME)
    assert a.parse_ok and a.reversibility == R


def test_deep_nesting_is_opaque_not_a_crash() -> None:
    src = "( " * 300 + "ls" + " )" * 300
    a = analyze(src, CWD, HOME)
    assert {"kind": "opaque", "target": "nesting too deep"} in a.effects


def test_effect_list_is_bounded() -> None:
    src = "touch " + " ".join(f"f{i}" for i in range(3000))
    a = analyze(src, CWD, HOME)
    assert len(a.effects) <= 1001
    assert {"kind": "opaque", "target": "too many effects"} in a.effects


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.sampled_from(_FUZZ_PIECES), max_size=30).map("".join))
def test_analyze_never_raises_and_paths_are_absolute(src: str) -> None:
    a = analyze(src, CWD, HOME)
    assert a.reversibility in (R, C, IRR)
    for e in a.effects:
        if e["kind"].startswith("fs_"):
            assert e["target"].startswith("/"), (src, e)
    assert isinstance(parse_summary(src)["root"], str)


def test_builtins_constant_covers_state_only_builtins() -> None:
    assert {"cd", "echo", "export", "true"} <= SHELL_BUILTINS
    assert not {"eval", "source", "exec", "kill"} & SHELL_BUILTINS


# --- parse_summary ---------------------------------------------------------------------


def test_an_analysis_leaves_no_garbage_cycle() -> None:
    # A cycle would keep a whole source (up to 1 MiB) and its tree until the next full
    # collection: 150 plans of a big source once grew the kernel by 70 MiB that way.
    src = "for f in a b; do rm $f; done; cat ~/x | grep -r y .; echo $(date) {a,b}"
    analyze(src, "/tmp", "/root")  # warm: module-level caches fill once
    gc.collect()
    gc.disable()
    try:
        analyze(src + " ", "/tmp", "/root")
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_parse_summary_ok() -> None:
    s = parse_summary("cd /tmp && ls -la | grep x; export A=1")
    assert s["ok"] is True
    assert "error" not in s
    assert s["commands"] == ["cd", "ls", "grep", "export"]
    assert s["root"] == "program"
    assert s["node_count"] > 10


def test_parse_summary_keeps_dynamic_argv0_as_written() -> None:
    assert parse_summary("$CMD x; /usr/bin/env")["commands"] == ["$CMD", "/usr/bin/env"]


def test_parse_summary_error_span() -> None:
    s = parse_summary('echo ok\necho "unterminated')
    assert s["ok"] is False
    err = s["error"]
    assert err["start"] == {"row": 1, "col": 5}
    assert err["end"]["row"] == 1
    assert "syntax error" in err["message"]


def test_parse_summary_missing_token() -> None:
    s = parse_summary("if true; then echo x")
    assert s["ok"] is False
    assert s["error"]["message"].startswith("syntax error")


def test_parse_summary_columns_count_characters() -> None:
    s = parse_summary("echo héé )")
    assert s["error"]["start"] == {"row": 0, "col": 9}


def test_parse_summary_is_bounded() -> None:
    s = parse_summary("; ".join(["true"] * (MAX_LIST + 50)))
    assert len(s["commands"]) == MAX_LIST
    assert s["truncated"] is True


def test_parse_summary_empty() -> None:
    s = parse_summary("")
    assert s["ok"] is True and s["commands"] == [] and s["root"] == "program"

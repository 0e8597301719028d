"""Policy loading and verdicts (docs/security.md, Policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shoal_mcp.kernel.access.policy import Policy, PolicyError, PrincipalPolicy, Verdict
from shoal_mcp.kernel.effects.analyzer import analyze

HOME = "/home/u"
LOCAL = "uid:1000"

GOOD = """
[principal."agent:reviewer"]
proc_spawn  = ["git", "rg", "ls", "cat", "/opt/tools/bin/lint"]
net_connect = ["github.com:443", "*.pythonhosted.org:*"]
env_read    = ["HOME", "PATH", "LC_*"]
env_write   = ["GIT_*"]
auto_apply  = "in-grant"
ungranted   = "ask"
opaque      = "ask"
approver    = false
journal_read = "own"
tasks_read  = "all"
max_tasks = 4
max_ptys = 1
max_subscriptions = 7
[principal."agent:reviewer".fs]
read   = ["~/project/**", "/etc/hosts"]
write  = ["~/project/build/**"]
delete = ["~/project/build/**", "/tmp/*.tmp"]

[principal."agent:strict"]
proc_spawn = ["*"]
ungranted = "deny"
opaque = "deny"
auto_apply = "never"
[principal."agent:strict".fs]
read = ["/**"]

[principal."agent:rev"]
proc_spawn = ["cat", "rm", "ls"]
auto_apply = "reversible"
session_write = false
[principal."agent:rev".fs]
read = ["/**"]
delete = ["/**"]

[principal."agent:optallow"]
opaque = "allow"
proc_spawn = ["bash"]
"""


def load(text: str, tmp_path: Path) -> Policy:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return Policy.load(str(path), home=HOME)


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    return load(GOOD, tmp_path)


def verdict(policy: Policy, principal: str, src: str, cwd: str = "/home/u/project") -> Verdict:
    a = analyze(src, cwd, HOME)
    return policy.for_principal(principal, LOCAL).evaluate(a.effects, a.reversibility)


def verdict_of(
    p: PrincipalPolicy, effects: list[dict[str, str]], rev: str = "reversible"
) -> Verdict:
    return p.evaluate(effects, rev)


def eff(kind: str, target: str) -> dict[str, str]:
    return {"kind": kind, "target": target}


# --- loading ---------------------------------------------------------------------------


def test_load_good_file(policy: Policy) -> None:
    assert policy.principals == ["agent:optallow", "agent:rev", "agent:reviewer", "agent:strict"]
    p = policy.for_principal("agent:reviewer", LOCAL)
    assert (p.max_tasks, p.max_ptys, p.max_subscriptions) == (4, 1, 7)
    assert p.approver is False and p.journal_read == "own" and p.tasks_read == "all"
    assert p.auto_apply == "in-grant"


def test_load_none_is_empty_policy() -> None:
    policy = Policy.load(None)
    assert policy.principals == []
    assert policy.for_principal(LOCAL, LOCAL).approver is True


def test_omitted_keys_take_defaults(tmp_path: Path) -> None:
    p = load('[principal."a"]\n', tmp_path).for_principal("a", LOCAL)
    assert p.approver is False and p.journal_read == "own" and p.tasks_read == "own"
    assert (p.max_tasks, p.max_ptys, p.max_subscriptions) == (8, 2, 16)
    assert p.auto_apply == "in-grant"
    assert verdict_of(p, [eff("proc_spawn", "ls")]).verdict == "deny"  # ungranted = deny


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[principal."agent:x".fs]\nrread = []', 'principal."agent:x".fs.rread'),
        ('[principal."agent:x"]\nproc_spawns = []', 'principal."agent:x".proc_spawns'),
        ('[principal."agent:x"]\nproc_spawn = "git"', 'principal."agent:x".proc_spawn'),
        ('[principal."agent:x"]\nproc_spawn = [1]', 'principal."agent:x".proc_spawn'),
        ('[principal."agent:x"]\nproc_spawn = [""]', 'principal."agent:x".proc_spawn'),
        ('[principal."agent:x"]\nenv_read = [true]', 'principal."agent:x".env_read'),
        ('[principal."agent:x"]\nenv_write = "X"', 'principal."agent:x".env_write'),
        ('[principal."agent:x"]\nnet_connect = ["github.com"]', 'principal."agent:x".net_connect'),
        ('[principal."agent:x"]\nnet_connect = ["h:99999"]', 'principal."agent:x".net_connect'),
        ('[principal."agent:x"]\nnet_connect = ["h:http"]', 'principal."agent:x".net_connect'),
        ('[principal."agent:x"]\nauto_apply = "always"', 'principal."agent:x".auto_apply'),
        ('[principal."agent:x"]\nungranted = "allow"', 'principal."agent:x".ungranted'),
        ('[principal."agent:x"]\nopaque = "maybe"', 'principal."agent:x".opaque'),
        ('[principal."agent:x"]\nsandbox = "yes"', 'principal."agent:x".sandbox'),
        ('[principal."agent:x"]\nsandbox = 1', 'principal."agent:x".sandbox'),
        ('[principal."agent:x"]\nsandboxed = true', 'principal."agent:x".sandboxed'),
        ('[principal."agent:x"]\napprover = "yes"', 'principal."agent:x".approver'),
        ('[principal."agent:x"]\nsession_write = 1', 'principal."agent:x".session_write'),
        ('[principal."agent:x"]\njournal_read = "everything"', 'principal."agent:x".journal_read'),
        ('[principal."agent:x"]\ntasks_read = "some"', 'principal."agent:x".tasks_read'),
        ('[principal."agent:x"]\nmax_tasks = -1', 'principal."agent:x".max_tasks'),
        ('[principal."agent:x"]\nmax_ptys = 1.5', 'principal."agent:x".max_ptys'),
        (
            '[principal."agent:x"]\nmax_subscriptions = true',
            'principal."agent:x".max_subscriptions',
        ),
        ('[principal."agent:x"]\nfs = 3', 'principal."agent:x".fs'),
        ('[principal."agent:x".fs]\nread = "/x"', 'principal."agent:x".fs.read'),
        ('[principal."agent:x".fs]\nwrite = ["relative/**"]', 'principal."agent:x".fs.write'),
        ('[principal."agent:x".fs]\ndelete = [3]', 'principal."agent:x".fs.delete'),
        ("principal = 3", "principal"),
        ('[principal]\n"agent:x" = 3', 'principal."agent:x"'),
        ('[agents."x"]\nproc_spawn = []', "agents"),
        ("version = 1", "version"),
    ],
)
def test_bad_keys_and_values_are_rejected_with_key_named(
    tmp_path: Path, text: str, key: str
) -> None:
    with pytest.raises(PolicyError) as info:
        load(text, tmp_path)
    assert info.value.key == key
    assert str(info.value).startswith(key + ":")


def test_unknown_key_message_format(tmp_path: Path) -> None:
    with pytest.raises(
        PolicyError,
        match=r'^principal\."agent:x"\.fs\.rread: unknown key \(did you mean read\?\)$',
    ):
        load('[principal."agent:x".fs]\nrread = []', tmp_path)


@pytest.mark.parametrize(
    "text, suggestion",
    [
        ('[principal."agent:x"]\nproc_spwan = []', "proc_spawn"),
        ("[kernal]\n", "kernel"),
        ("[kernel]\nmax_conections = 3", "max_connections"),
    ],
)
def test_unknown_keys_suggest_the_nearest_known_one(
    tmp_path: Path, text: str, suggestion: str
) -> None:
    with pytest.raises(PolicyError) as info:
        load(text, tmp_path)
    assert info.value.why == f"unknown key (did you mean {suggestion}?)"


def test_an_unknown_key_like_nothing_known_gets_no_suggestion(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load('[principal."agent:x"]\nzzzz = 1', tmp_path)
    assert info.value.why == "unknown key"


def test_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="invalid TOML"):
        load("[principal.\n", tmp_path)
    with pytest.raises(PolicyError, match="cannot read"):
        Policy.load(str(tmp_path / "nope.toml"))


# --- verdicts ----------------------------------------------------------------------------


def test_in_grant_reads_are_allowed(policy: Policy) -> None:
    v = verdict(policy, "agent:reviewer", "rg TODO src && cat README.md | ls")
    assert v.verdict == "allow", v.reasons
    assert v.ungranted == []


def test_globstar_covers_the_directory_itself(policy: Policy) -> None:
    assert verdict(policy, "agent:reviewer", "ls ~/project").verdict == "allow"
    assert verdict(policy, "agent:reviewer", "ls").verdict == "allow"  # cwd is ~/project


def test_tilde_in_grants_expands_to_home(policy: Policy) -> None:
    p = policy.for_principal("agent:reviewer", LOCAL)
    assert verdict_of(p, [eff("fs_read", "/home/u/project/a/b/.hidden")]).verdict == "allow"
    v = verdict_of(p, [eff("fs_read", "/home/other/project/x")])
    assert v.verdict == "ask" and v.ungranted == [eff("fs_read", "/home/other/project/x")]


def test_outside_grants_follows_ungranted_setting(policy: Policy) -> None:
    v = verdict(policy, "agent:reviewer", "cat /etc/passwd")
    assert v.verdict == "ask"
    assert any("fs_read /etc/passwd" in r and "ungranted = ask" in r for r in v.reasons)
    v = verdict(policy, "agent:strict", "ls", cwd="/")  # reads ok, auto_apply never → ask
    assert v.verdict == "ask"
    v = verdict(policy, "agent:strict", "touch /tmp/x")
    assert v.verdict == "deny"
    assert v.ungranted == [eff("fs_write", "/tmp/x")]


def test_subtree_targets_need_a_recursive_grant(policy: Policy) -> None:
    p = policy.for_principal("agent:reviewer", LOCAL)
    assert verdict_of(p, [eff("fs_delete", "/home/u/project/build/**")]).verdict == "allow"
    assert verdict_of(p, [eff("fs_delete", "/home/u/project/build/obj/**")]).verdict == "allow"
    # `/tmp/*.tmp` grants single files, not a whole directory tree named x.tmp
    assert verdict_of(p, [eff("fs_delete", "/tmp/a.tmp")]).verdict == "allow"
    assert verdict_of(p, [eff("fs_delete", "/tmp/a.tmp/**")]).verdict == "ask"
    assert verdict_of(p, [eff("fs_delete", "/home/u/project/**")]).verdict == "ask"


def test_root_subtree(tmp_path: Path) -> None:
    p = load('[principal."a".fs]\nread = ["/**"]', tmp_path).for_principal("a", LOCAL)
    assert verdict_of(p, [eff("fs_read", "/**")]).verdict == "allow"
    assert verdict_of(p, [eff("fs_read", "/")]).verdict == "allow"


def test_proc_spawn_matching(policy: Policy) -> None:
    p = policy.for_principal("agent:reviewer", LOCAL)
    ok = [eff("proc_spawn", t) for t in ("git", "/usr/bin/git", "/opt/tools/bin/lint")]
    assert verdict_of(p, ok).verdict == "allow"
    for bad in ("./git", "/tmp/evil/git", "lint", "make"):
        v = verdict_of(p, [eff("proc_spawn", bad)])
        assert v.verdict == "ask", bad
    # state-only builtins need no grant
    assert verdict_of(p, [eff("proc_spawn", "cd"), eff("proc_spawn", "echo")]).verdict == "allow"


def test_net_connect_host_port_globs(policy: Policy) -> None:
    p = policy.for_principal("agent:reviewer", LOCAL)
    assert verdict_of(p, [eff("net_connect", "github.com:443")]).verdict == "allow"
    assert verdict_of(p, [eff("net_connect", "GitHub.com:443")]).verdict == "allow"
    assert verdict_of(p, [eff("net_connect", "files.pythonhosted.org:8443")]).verdict == "allow"
    assert verdict_of(p, [eff("net_connect", "github.com:22")]).verdict == "ask"
    assert verdict_of(p, [eff("net_connect", "evil.com:443")]).verdict == "ask"
    # an unknown host is only covered by a `*` host grant
    assert verdict_of(p, [eff("net_connect", "*:*")]).verdict == "ask"


def test_net_star_grant_covers_unknown_remote(tmp_path: Path) -> None:
    p = load(
        '[principal."a"]\nproc_spawn=["git"]\nnet_connect = ["*:*"]\n'
        '[principal."a".fs]\nread=["/**"]\nwrite=["/**"]',
        tmp_path,
    ).for_principal("a", LOCAL)
    a = analyze("git pull", "/w", HOME)
    assert p.evaluate(a.effects, a.reversibility).verdict == "allow"


def test_env_grants(policy: Policy) -> None:
    p = policy.for_principal("agent:reviewer", LOCAL)
    assert verdict_of(p, [eff("env_read", "LC_ALL"), eff("env_read", "HOME")]).verdict == "allow"
    assert verdict_of(p, [eff("env_read", "AWS_SECRET")]).verdict == "ask"
    assert verdict_of(p, [eff("env_read", "*")]).verdict == "ask"  # whole env ≠ a glob match
    assert verdict_of(p, [eff("env_write", "GIT_PAGER")]).verdict == "allow"
    assert verdict_of(p, [eff("env_write", "PATH")]).verdict == "ask"
    assert p.env_readable("PATH") and p.env_readable("LC_CTYPE")
    assert not p.env_readable("AWS_SECRET") and not p.env_readable("home")


def test_session_write_default_and_restriction(policy: Policy) -> None:
    p = policy.for_principal("agent:reviewer", LOCAL)
    assert verdict_of(p, [eff("session_write", "cwd")]).verdict == "allow"
    q = policy.for_principal("agent:rev", LOCAL)
    v = verdict_of(q, [eff("session_write", "cwd")])
    assert v.verdict == "deny" and v.ungranted == [eff("session_write", "cwd")]


@pytest.mark.parametrize(
    ("principal", "expected"),
    [("agent:reviewer", "ask"), ("agent:strict", "deny"), ("agent:optallow", "allow")],
)
def test_opaque_settings(policy: Policy, principal: str, expected: str) -> None:
    p = policy.for_principal(principal, LOCAL)
    v = verdict_of(p, [eff("opaque", "eval")], "irreversible")
    assert v.verdict == expected
    if expected != "allow":
        assert any("opaque eval" in r for r in v.reasons)


def test_deny_beats_ask_beats_allow(policy: Policy, tmp_path: Path) -> None:
    p = policy.for_principal("agent:strict", LOCAL)  # ungranted deny, opaque deny
    q = policy.for_principal("agent:reviewer", LOCAL)  # ungranted ask, opaque ask
    mixed = [eff("proc_spawn", "ls"), eff("fs_read", "/etc/hosts"), eff("opaque", "eval")]
    assert verdict_of(q, mixed, "irreversible").verdict == "ask"
    assert verdict_of(p, mixed + [eff("fs_write", "/x")], "irreversible").verdict == "deny"
    r = load(
        '[principal."a"]\nproc_spawn=["ls"]\nungranted="ask"\nopaque="deny"', tmp_path
    ).for_principal("a", LOCAL)
    v = verdict_of(
        r,
        [eff("proc_spawn", "make"), eff("opaque", "eval"), eff("proc_spawn", "ls")],
        "irreversible",
    )
    assert v.verdict == "deny"
    assert len(v.reasons) == 2 and v.ungranted == [eff("proc_spawn", "make")]


@pytest.mark.parametrize(
    ("mode", "rev", "expected"),
    [
        ("in-grant", "reversible", "allow"),
        ("in-grant", "irreversible", "allow"),
        ("never", "reversible", "ask"),
        ("never", "conditional", "ask"),
        ("reversible", "reversible", "allow"),
        ("reversible", "conditional", "ask"),
        ("reversible", "irreversible", "ask"),
    ],
)
def test_auto_apply_modes(tmp_path: Path, mode: str, rev: str, expected: str) -> None:
    p = load(f'[principal."a"]\nproc_spawn = ["*"]\nauto_apply = "{mode}"', tmp_path).for_principal(
        "a", LOCAL
    )
    v = verdict_of(p, [eff("proc_spawn", "make")], rev)
    assert v.verdict == expected
    if expected == "ask":
        assert any("auto_apply" in r for r in v.reasons)


def test_auto_apply_never_turns_ask_only_from_allow(policy: Policy) -> None:
    p = policy.for_principal("agent:strict", LOCAL)
    assert verdict_of(p, [eff("fs_write", "/x")]).verdict == "deny"


def test_auto_apply_reversible_end_to_end(policy: Policy) -> None:
    assert verdict(policy, "agent:rev", "cat /etc/hosts").verdict == "allow"
    v = verdict(policy, "agent:rev", "rm /tmp/x")
    assert v.verdict == "ask"
    assert any("irreversible" in r for r in v.reasons)


def test_local_principal_is_permissive_without_table(policy: Policy) -> None:
    p = policy.for_principal(LOCAL, LOCAL)
    assert p.approver and p.journal_read == "all" and p.tasks_read == "all"
    assert (p.max_tasks, p.max_ptys, p.max_subscriptions) == (64, 16, 256)
    a = analyze("rm -rf / ; eval x; curl -d x https://e.com", "/", HOME)
    v = p.evaluate(a.effects, a.reversibility)
    assert v.verdict == "allow" and v.reasons == [] and v.ungranted == []
    assert p.env_readable("AWS_SECRET")


def test_local_principal_with_table_follows_it(tmp_path: Path) -> None:
    pol = load(f'[principal."{LOCAL}"]\nproc_spawn = ["ls"]\n', tmp_path)
    p = pol.for_principal(LOCAL, LOCAL)
    assert p.approver is True and p.journal_read == "all"  # human defaults kept
    assert verdict_of(p, [eff("proc_spawn", "ls")]).verdict == "allow"
    assert verdict_of(p, [eff("proc_spawn", "rm")]).verdict == "deny"
    assert not p.env_readable("HOME")


def test_principal_without_table_is_denied_everything(policy: Policy) -> None:
    p = policy.for_principal("agent:stranger", LOCAL)
    assert p.approver is False and p.journal_read == "own" and p.tasks_read == "own"
    assert (p.max_tasks, p.max_ptys, p.max_subscriptions) == (8, 2, 16)
    for effects in ([], [eff("proc_spawn", "ls")], [eff("fs_read", "/tmp")]):
        v = verdict_of(p, effects)
        assert v.verdict == "deny"
        assert "no policy table" in v.reasons[0]
    assert not p.env_readable("HOME")


def test_another_uid_is_not_the_local_human(policy: Policy) -> None:
    assert (
        verdict_of(policy.for_principal("uid:0", LOCAL), [eff("proc_spawn", "ls")]).verdict
        == "deny"
    )


def test_unknown_effect_kind_is_ungranted(policy: Policy) -> None:
    p = policy.for_principal("agent:reviewer", LOCAL)
    v = verdict_of(p, [eff("teleport", "mars")])
    assert v.verdict == "ask" and v.ungranted == [eff("teleport", "mars")]


def test_verdict_to_dict(policy: Policy) -> None:
    d = verdict(policy, "agent:reviewer", "cat /etc/passwd").to_dict()
    assert set(d) == {"verdict", "reasons", "ungranted"}
    assert d["ungranted"] == [eff("fs_read", "/etc/passwd")]


def test_for_principal_is_cached(policy: Policy) -> None:
    assert policy.for_principal("agent:rev", LOCAL) is policy.for_principal("agent:rev", LOCAL)


# --- the OS sandbox keys ---------------------------------------------------------------

SANDBOX_POLICY = """
[principal."agent:unset"]
[principal."agent:boxed-opaque"]
opaque = "sandbox"
[principal."agent:unboxed"]
sandbox = false
opaque = "sandbox"
[principal."agent:allow"]
opaque = "allow"
[principal."uid:1000"]
proc_spawn = ["*"]
[principal."agent:net"]
net_connect = ["github.com:443", "*.pypi.org:443"]
[principal."agent:net".fs]
read = ["~/project/**", "/etc/hosts"]
write = ["~/project/build/**"]
delete = ["~/project/build/**"]
"""


def test_sandbox_defaults(tmp_path: Path) -> None:
    policy = load(SANDBOX_POLICY, tmp_path)
    assert policy.for_principal("agent:unset", LOCAL).sandboxed is True
    assert policy.for_principal("agent:unboxed", LOCAL).sandboxed is False
    assert policy.for_principal("agent:no-table", LOCAL).sandboxed is True
    assert policy.for_principal(LOCAL, LOCAL).sandboxed is False  # a table, key unset
    assert Policy().for_principal(LOCAL, LOCAL).sandboxed is False  # no table at all
    opted_in = load('[principal."uid:1000"]\nsandbox = true\n', tmp_path)
    assert opted_in.for_principal(LOCAL, LOCAL).sandboxed is True


@pytest.mark.parametrize(
    ("principal", "enforcing", "mode"),
    [
        ("agent:unset", True, "sandbox"),  # the default where the sandbox holds
        ("agent:unset", False, "deny"),
        ("agent:boxed-opaque", True, "sandbox"),
        ("agent:boxed-opaque", False, "ask"),  # cannot sandbox: ask instead
        ("agent:unboxed", True, "ask"),  # sandbox = false: nothing to run it in
        ("agent:allow", True, "allow"),
        ("agent:allow", False, "allow"),
    ],
)
def test_opaque_mode(tmp_path: Path, principal: str, enforcing: bool, mode: str) -> None:
    p = load(SANDBOX_POLICY, tmp_path).for_principal(principal, LOCAL)
    assert p.opaque_mode(enforcing) == mode


def test_opaque_verdicts_follow_enforcement(tmp_path: Path) -> None:
    policy = load(SANDBOX_POLICY, tmp_path)
    opaque = [eff("opaque", "eval")]
    unset = policy.for_principal("agent:unset", LOCAL)
    assert unset.evaluate(opaque, "irreversible", enforcing=True).verdict == "allow"
    assert unset.evaluate(opaque, "irreversible").verdict == "deny"
    boxed = policy.for_principal("agent:boxed-opaque", LOCAL)
    v = boxed.evaluate(opaque, "irreversible", enforcing=False)
    assert v.verdict == "ask" and "no sandbox here" in v.reasons[0]
    # Other effects are judged as before: "sandbox" only settles the opaque ones.
    mixed = [*opaque, eff("proc_spawn", "rm")]
    assert unset.evaluate(mixed, "irreversible", enforcing=True).verdict == "deny"


def test_sandbox_spec_from_grants(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "project" / "build").mkdir(parents=True)
    state, tmp = tmp_path / "state", tmp_path / "tmp"
    state.mkdir()
    tmp.mkdir()
    (tmp_path / "policy.toml").write_text(SANDBOX_POLICY)
    p = Policy.load(str(tmp_path / "policy.toml"), home=str(home)).for_principal("agent:net", LOCAL)
    assert p.fs_grants("write") == ("~/project/build/**",)
    assert p.net_grants == ("github.com:443", "*.pypi.org:443")
    spec = p.sandbox_spec(tmpdir=str(tmp), forbidden=[str(state)])
    assert str(home / "project") in spec.read
    assert ("/etc" in spec.read) != ("/etc/hosts" in spec.read)  # covered exactly once
    assert str(home / "project" / "build") in spec.write
    assert str(home / "project" / "build") in spec.delete
    assert spec.tcp_connect == (443,) and spec.private_net is False
    assert spec.tmpdir == str(tmp)


# --- budgets (issue 14) ------------------------------------------------------------------


def test_budget_keys_have_defaults_and_validate() -> None:
    from shoal_mcp.kernel.access.budgets import KERNEL_BUDGETS, PRINCIPAL_BUDGETS

    pol = Policy.from_dict(
        {"principal": {"agent:x": {"max_plans": 3, "max_channel_bytes": 5 * 2**30}}}
    )
    agent = pol.for_principal("agent:x", "uid:0")
    assert agent.budget("max_plans") == 3 and agent.budget("max_channel_bytes") == 5 * 2**30
    assert agent.budget("max_channels") == PRINCIPAL_BUDGETS["max_channels"][0]
    local = pol.for_principal("uid:0", "uid:0")
    assert local.budget("max_plans") == PRINCIPAL_BUDGETS["max_plans"][1]
    assert pol.kernel == KERNEL_BUDGETS
    with pytest.raises(PolicyError) as exc:
        Policy.from_dict({"principal": {"agent:x": {"max_plans": -1}}})
    assert exc.value.key == 'principal."agent:x".max_plans'


def test_kernel_table_is_validated() -> None:
    pol = Policy.from_dict({"kernel": {"max_connections": 7, "max_state_bytes": 1024}})
    assert pol.kernel["max_connections"] == 7 and pol.kernel["max_state_bytes"] == 1024
    for bad, key in (
        ({"kernel": {"nope": 1}}, "kernel.nope"),
        ({"kernel": {"max_connections": "many"}}, "kernel.max_connections"),
        ({"kernel": 3}, "kernel"),
    ):
        with pytest.raises(PolicyError) as exc:
            Policy.from_dict(bad)
        assert exc.value.key == key

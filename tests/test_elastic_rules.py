"""The elastic restart rules (launcher/elastic.py), the re-plan (plan.replan), hostfile spares and
the incident records, as pure functions: no process is started."""

from __future__ import annotations

import json

import pytest

from dslaunch.launcher import incidents
from dslaunch.launcher.elastic import (
    CRASH_LOOP_EXIT,
    NO_HOSTS_EXIT,
    AttemptProgress,
    ElasticPolicy,
    ElasticStop,
    parse_nnodes,
)
from dslaunch.launcher.hostfile import HostfileError, parse_hostfile_text
from dslaunch.launcher.plan import WorldPlan, build_plan, replan
from dslaunch.launcher.resources import ResourceError, select_with_spares

S = [0, 1]


def policy(planned=("h1", "h2", "h3"), spares=(), lo=2, hi=3):
    return ElasticPolicy.start({h: S for h in planned}, {h: S for h in spares}, lo, hi)


def answering(*hosts):
    asked = []

    def probe(ask):
        asked.append(list(ask))
        return set(hosts) & set(ask)

    probe.asked = asked
    return probe


@pytest.mark.parametrize("text,want", [("2", (2, 2)), ("2:4", (2, 4)), ("1:1", (1, 1))])
def test_parse_nnodes(text, want):
    assert parse_nnodes(text) == want


@pytest.mark.parametrize("text", ["0", "3:2", "a", "1:2:3", "", "2:"])
def test_parse_nnodes_refuses(text):
    with pytest.raises(ValueError, match="--nnodes"):
        parse_nnodes(text)


def test_first_plan_takes_max_hosts_and_the_rest_wait():
    p = ElasticPolicy.start({"h1": S, "h2": S, "h3": S}, {"h9": S}, 1, 2)
    assert p.planned == ["h1", "h2"] and p.spares == ["h3", "h9"]
    with pytest.raises(ElasticStop, match="fewer than the minimum 4"):
        ElasticPolicy.start({"h1": S, "h2": S}, {}, 4, 4)


def test_lost_host_is_dropped_and_the_rest_go_on():
    p = policy()
    assert p.exclude(0, {"h2": "no heartbeat for 5 s"}, "h2") == [("h2", "no heartbeat for 5 s")]
    hosts, rejoined = p.next_hosts(answering("h1", "h3"))
    assert hosts == ["h1", "h3"] and rejoined == [] and p.excluded == {"h2": "no heartbeat for 5 s"}
    assert p.selection() == {"h1": S, "h3": S}


def test_spare_takes_the_lost_hosts_place():
    p = policy(planned=("h1", "h2"), spares=("h4",), lo=2, hi=2)
    p.exclude(0, {"h1": "no heartbeat for 5 s"}, "h1")
    assert p.next_hosts(answering("h2", "h4"))[0] == ["h2", "h4"]  # survivors keep their order
    assert p.spares == []


def test_silent_spare_is_skipped():
    p = policy(planned=("h1", "h2", "h3"), spares=("h4", "h5"), lo=3, hi=3)
    p.exclude(0, {"h2": "lost"}, "h2")
    assert p.next_hosts(answering("h1", "h3", "h5"))[0] == ["h1", "h3", "h5"]


def test_fewer_than_min_is_refused():
    p = policy(lo=3, hi=3)
    p.exclude(0, {"h3": "no heartbeat for 5 s"}, "h3")
    with pytest.raises(ElasticStop) as e:
        p.next_hosts(answering("h1", "h2"))
    assert e.value.code == NO_HOSTS_EXIT
    assert "only 2 host(s) can run the job (h1, h2), fewer than the minimum 3" in e.value.reason
    assert "h3 (no heartbeat for 5 s)" in e.value.reason


def test_a_minority_never_goes_on():
    # a split: this side reaches 2 of 5 hosts, enough for MIN 2 but not a majority
    p = policy(planned=("h1", "h2", "h3", "h4", "h5"), lo=2, hi=5)
    p.exclude(0, {"h3": "lost", "h4": "lost", "h5": "lost"}, "h3")
    with pytest.raises(ElasticStop, match="no majority: 2 of the 5 hosts"):
        p.next_hosts(answering("h1", "h2"))
    # half is not a majority either: the other half could think the same
    p = policy(planned=("h1", "h2"), lo=1, hi=2)
    p.exclude(0, {"h2": "lost"}, "h2")
    with pytest.raises(ElasticStop, match="no majority: 1 of the 2"):
        p.next_hosts(answering("h1"))


def test_with_fenced_agents_min_decides():
    # the agents the controller cannot reach stop their own ranks (fencing): no split can leave
    # two halves training, so the majority rule gives way to the MIN the user wrote
    p = policy(planned=("h1", "h2"), lo=1, hi=2)
    p.fencing = True
    p.exclude(0, {"h2": "lost"}, "h2")
    assert p.next_hosts(answering("h1"))[0] == ["h1"]
    p = policy(planned=("h1", "h2", "h3", "h4", "h5"), lo=2, hi=5)
    p.fencing = True
    p.exclude(0, {"h3": "lost", "h4": "lost", "h5": "lost"}, "h3")
    assert p.next_hosts(answering("h1", "h2"))[0] == ["h1", "h2"]
    with pytest.raises(ElasticStop, match="fewer than the minimum 2"):  # MIN still holds
        p.exclude(1, {"h2": "lost"}, "h2")
        p.next_hosts(answering("h1"))


def test_survivor_that_does_not_answer_is_left_out():
    p = policy(planned=("h1", "h2", "h3", "h4"), lo=2, hi=4)
    p.exclude(0, {"h4": "lost"}, "h4")
    assert p.next_hosts(answering("h1", "h2", "h3"))[0] == ["h1", "h2", "h3"]


def test_lost_host_rejoins_when_it_answers_again_up_to_max():
    p = policy()
    p.exclude(0, {"h2": "lost"}, "h2")
    probe = answering("h1", "h3")
    p.next_hosts(probe)
    assert "h2" not in probe.asked[0]  # just lost: not asked in the same restart
    p.exclude(1, {}, "h3")  # the next attempt fails for another reason
    hosts, rejoined = p.next_hosts(answering("h1", "h2", "h3"))
    assert hosts == ["h1", "h3", "h2"] and rejoined == ["h2"] and p.excluded == {}
    assert [h for _, h, _ in p.history] == ["h2"]


def test_rejoin_is_capped_at_max():
    p = policy(planned=("h1", "h2"), spares=("h4",), lo=2, hi=2)
    p.exclude(0, {"h2": "lost"}, "h2")
    p.next_hosts(answering("h1", "h4"))
    hosts, rejoined = p.next_hosts(answering("h1", "h2", "h4"))
    assert hosts == ["h1", "h4"] and rejoined == [] and "h2" in p.excluded


def test_same_culprit_twice_in_a_row_is_excluded_for_good():
    p = policy()
    assert p.exclude(0, {}, "h2") == []
    assert p.next_hosts(answering("h1", "h2", "h3"))[0] == ["h1", "h2", "h3"]
    assert p.exclude(1, {}, "h2") == [("h2", "its ranks failed in 2 attempts in a row")]
    assert p.next_hosts(answering("h1", "h2", "h3"))[0] == ["h1", "h3"]
    assert p.next_hosts(answering("h1", "h2", "h3"))[0] == ["h1", "h3"]  # answers, stays out


def test_culprit_is_kept_when_the_job_cannot_go_on_without_it():
    p = policy(planned=("h1", "h2"), lo=2, hi=2)
    assert p.exclude(0, {}, "h1") == [] and p.exclude(1, {}, "h1") == []
    assert p.next_hosts(answering("h1", "h2"))[0] == ["h1", "h2"]
    p = ElasticPolicy.start({"localhost": S}, {}, 1, 1)
    assert p.exclude(0, {}, "localhost") == [] and p.exclude(1, {}, "localhost") == []


def test_different_culprits_reset_the_streak():
    p = policy()
    for attempt, host in enumerate(["h1", "h2", "h1", "h2"]):
        assert p.exclude(attempt, {}, host) == []


def test_crash_loop_needs_three_restarts_without_progress():
    p = policy()
    none = AttemptProgress()
    assert p.crash_loop(0, none) is None  # the first attempt does not count
    assert p.crash_loop(1, none) is None
    assert p.crash_loop(2, none) is None
    reason = p.crash_loop(3, none)
    assert reason.startswith("crash loop: 3 restarts in a row made no progress")
    assert CRASH_LOOP_EXIT not in (0, 1, NO_HOSTS_EXIT)


def test_progress_resets_the_crash_loop_count():
    p = policy()
    p.crash_loop(0, AttemptProgress(step=10, saved=10, loaded=-1))
    p.crash_loop(1, AttemptProgress(step=10, saved=10, loaded=10))  # nothing new
    p.crash_loop(2, AttemptProgress(step=10, saved=10, loaded=10))
    assert p.crash_loop(3, AttemptProgress(step=12, saved=10, loaded=10)) is None  # trained on
    assert p.crash_loop(4, AttemptProgress(step=12, saved=12, loaded=10)) is None  # saved newer
    p.crash_loop(5, AttemptProgress(step=12, saved=12, loaded=12))
    p.crash_loop(6, AttemptProgress(step=12, saved=12, loaded=12))
    assert "last checkpoint saved: step 12" in p.crash_loop(7, AttemptProgress(12, 12, 12))


def test_attempt_progress_from_records_with_unfilled_fields():
    a = AttemptProgress()
    a.update({"step": -1, "ckpt_saved_step": -1, "ckpt_loaded_step": -1})
    assert not a.trained()
    a.update({"step": 4, "ckpt_loaded_step": 4})
    assert not a.trained()
    a.update({"step": 5})
    assert a.trained() and (a.step, a.saved, a.loaded) == (5, -1, 4)


def test_replan_renumbers_and_moves_the_master():
    plan = build_plan({"h1": [0, 1], "h2": [0, 1], "h3": [0]}, program=["t.py"], launcher="ssh")
    new = replan(plan, {"h2": [0, 1], "h3": [0]})
    assert new.world_size == 3 and new.master_addr == "h2" and new.run_id == plan.run_id
    assert [(n["host"], n["node_rank"], n["ranks"]) for n in new.nodes] == \
        [("h2", 0, [0, 1]), ("h3", 1, [2])]
    assert plan.world_size == 5  # the old plan is untouched
    kept = replan(plan, {"h1": [0, 1], "h3": [0]})
    assert kept.master_addr == "h1"
    user = build_plan({"h1": [0], "h2": [0]}, program=["t.py"], master_addr="10.0.0.5")
    assert replan(user, {"h2": [0]}).master_addr == "10.0.0.5"


def test_hostfile_spare_word():
    spares: set = set()
    hosts = parse_hostfile_text("a slots=2\nb slots=2 spare  # standby\nc slots=1\n", spares=spares)
    assert hosts == {"a": 2, "b": 2, "c": 1} and spares == {"b"}
    assert parse_hostfile_text("a slots=2\nb slots=1 spare\n") == {"a": 2, "b": 1}
    with pytest.raises(HostfileError, match=r"<hostfile>:1: unexpected text .*'spares'.*'spare'"):
        parse_hostfile_text("a slots=2 spares\n")
    with pytest.raises(HostfileError, match="every host is marked 'spare'"):
        parse_hostfile_text("a slots=2 spare\n")


def test_spares_are_kept_out_of_the_first_selection():
    hosts = {"a": 2, "b": 2, "s": 2}
    assert select_with_spares(hosts, {"s"}) == ({"a": [0, 1], "b": [0, 1]}, {"s": [0, 1]})
    assert select_with_spares(hosts, {"s"}, num_nodes=1, nproc_per_node=1) == \
        ({"a": [0]}, {"s": [0]})
    assert select_with_spares(hosts, {"s"}, exclude="s") == ({"a": [0, 1], "b": [0, 1]}, {})
    with pytest.raises(ResourceError, match="leaves only spare hosts"):
        select_with_spares(hosts, {"s"}, include="s")


def test_incident_record_and_summary(tmp_path):
    path = incidents.incidents_path(str(tmp_path))
    log = incidents.IncidentLog(path)
    inc = incidents.Incident(attempt=0, time=100.0, detector=incidents.detector("lost"),
                             kind="lost", reason="host h2 lost", culprit_host="h2",
                             last_collective_seq=incidents.last_collectives(
                                 {"0": {"coll_seq": 0, "last_seq": 7}, "1": {"coll_seq": 8}}),
                             last_step=13, action="restart", excluded_hosts={"h2": "lost"})
    inc.resumed(10, 112.5)
    log.write(inc)
    rec = incidents.read(path)[0]
    assert rec["detector"] == "liveness" and rec["culprit_host"] == "h2"
    assert rec["last_collective_seq"] == {"0": 7, "1": 8}
    assert (rec["resumed_from"], rec["steps_redone"], rec["seconds_to_training"]) == (10, 3, 12.5)
    assert incidents.detector("rank") == "exit" and incidents.detector("hang") == "progress"
    text = incidents.summary(log.written, 2, "finished", [(0, "h2", "lost")], 4, path)
    assert "1 fault(s) handled in 2 attempt(s)" in text and "h2 at attempt 0 (lost)" in text
    assert "Training again after 12.5 s" in text and "Steps redone: 3" in text
    assert json.loads(open(path).read().splitlines()[0])["attempt"] == 0
    assert incidents.summary([], 1, "finished", [], 4, path) == ""


def test_a_world_size_the_config_cannot_train_is_refused_before_restarting():
    from dslaunch.launcher.recovery import config_fits

    def plan_of(world_size, config):
        return WorldPlan(world_size=world_size, master_addr="h1", master_port=1, launcher="ssh",
                         nodes=[], config=config and json.dumps(config), config_path="ds.json")

    fixed = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}
    config_fits(plan_of(4, fixed))
    config_fits(plan_of(2, fixed))  # gradient accumulation 2 keeps the batch
    with pytest.raises(ElasticStop) as err:
        config_fits(plan_of(3, fixed))
    assert err.value.code == NO_HOSTS_EXIT
    assert "3 ranks" in err.value.reason and "train_batch_size" in err.value.reason
    elastic = {"elasticity": {"enabled": True, "max_train_batch_size": 24,
                              "micro_batch_sizes": [2, 4], "min_gpus": 1, "max_gpus": 12,
                              "version": 0.1}}
    config_fits(plan_of(3, elastic))
    with pytest.raises(ElasticStop) as err:
        config_fits(plan_of(5, elastic))
    assert "elasticity" in err.value.reason
    config_fits(plan_of(5, None))  # no config: nothing to check

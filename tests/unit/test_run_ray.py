"""``mtpdiag run`` for Ray jobs: which commands are Ray jobs, and how the Flight Recorder's variables are given to
their actors (``pipeline.run_ray.plan``, pure). What Ray and the actors then do with them is
tests/e2e/test_run_ray_e2e.py's, on a real cluster."""

from __future__ import annotations

import json

from mtpdiag.pipeline.run_ray import JOB_CONFIG_ENV, OVERRIDE_ENV, plan, submit_at, verl_driver, with_submission_id
from mtpdiag.vocabulary.ray_launch import RayEnvRoute
from support.jobs_e2e import run_cli

FR = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "/runs/r1/fr/rank_"}


def test_ray_job_submit_is_found_in_its_spellings_and_not_in_the_entrypoint():
    assert submit_at(["ray", "job", "submit", "--", "python", "x.py"]) == 3
    assert submit_at(["/opt/bin/ray", "job", "submit", "--no-wait", "--", "python"]) == 3
    assert submit_at(["python", "-m", "ray.scripts.scripts", "job", "submit", "--", "x"]) == 5
    assert submit_at(["ray", "job", "logs", "x"]) is None
    assert submit_at(["torchrun", "--", "ray", "job", "submit"]) is None  # after the dashes: the job's own words
    assert submit_at(["sh", "-c", "ray job submit -- x"]) is None


def test_verls_ray_drivers_are_found_and_its_torchrun_trainers_are_not():
    assert verl_driver(["python", "-m", "verl.trainer.main_ppo", "trainer.nnodes=1"]) == "verl.trainer.main_ppo"
    assert verl_driver(["python3.11", "-mverl.trainer.main_ppo"]) == "verl.trainer.main_ppo"
    assert verl_driver(["/usr/bin/python3", "-u", "src/verl/trainer/main_ppo.py", "x=1"]) == "verl.trainer.main_ppo"
    assert verl_driver(["torchrun", "-m", "verl.trainer.fsdp_sft_trainer"]) is None
    assert verl_driver(["python", "-m", "verl.trainer.fsdp_sft_trainer"]) is None
    assert verl_driver(["python", "train.py", "-m", "verl.trainer.main_ppo"]) is None  # the script's argument
    assert plan(["torchrun", "--nproc-per-node", "4", "train.py"], {}, FR, None) is None


def test_a_driver_gets_them_as_a_submitted_jobs_runtime_env_and_its_own_keys_win():
    launch = plan(["python", "-m", "verl.trainer.main_ppo"], {}, FR, None)
    assert launch is not None and launch.route == RayEnvRoute.JOB_CONFIG_ENV
    assert json.loads(launch.env[JOB_CONFIG_ENV]) == {"runtime_env": {"env_vars": FR}}
    assert launch.env[OVERRIDE_ENV] == "1" and launch.address == "auto"
    assert launch.command == ["python", "-m", "verl.trainer.main_ppo"]  # the command is the user's, untouched
    assert launch.record()["actor_env"] == sorted(FR)
    # A user who set RAY_OVERRIDE_JOB_RUNTIME_ENV themselves keeps their choice.
    assert OVERRIDE_ENV not in plan(["python", "x.py"], {OVERRIDE_ENV: "0"}, FR, "auto").env  # type: ignore[union-attr]


def test_run_inside_a_submitted_job_merges_into_its_runtime_env_and_keeps_its_keys():
    theirs = {"runtime_env": {"working_dir": "s3://b/x.zip", "env_vars": {"TORCH_FR_BUFFER_SIZE": "100"}}}
    launch = plan(["python", "driver.py"], {JOB_CONFIG_ENV: json.dumps(theirs)}, FR, "auto")
    assert launch is not None
    merged = json.loads(launch.env[JOB_CONFIG_ENV])["runtime_env"]
    assert merged["working_dir"] == "s3://b/x.zip"
    assert merged["env_vars"] == {**FR, "TORCH_FR_BUFFER_SIZE": "100"}
    assert launch.kept == ["TORCH_FR_BUFFER_SIZE"] and sorted(launch.actor_env) == ["TORCH_FR_DUMP_TEMP_FILE"]
    assert OVERRIDE_ENV not in launch.env  # the job's conflicts stay as Ray treats them without run
    assert "keeping the job's own runtime_env value of TORCH_FR_BUFFER_SIZE" in launch.lines()


def test_a_verl_override_of_the_same_variable_is_kept():
    override = "+ray_kwargs.ray_init.runtime_env.env_vars.TORCH_FR_BUFFER_SIZE=5"
    command = ["python", "-m", "verl.trainer.main_ppo", override]
    launch = plan(command, {}, FR, None)
    assert launch is not None and launch.kept == ["TORCH_FR_BUFFER_SIZE"]
    assert json.loads(launch.env[JOB_CONFIG_ENV])["runtime_env"]["env_vars"] == {
        "TORCH_FR_DUMP_TEMP_FILE": "/runs/r1/fr/rank_"
    }


def test_ray_job_submit_gets_them_in_runtime_env_json_merged_into_the_users():
    launch = plan(["ray", "job", "submit", "--no-wait", "--", "python", "d.py"], {}, FR, None)
    assert launch is not None and launch.route == RayEnvRoute.SUBMIT_RUNTIME_ENV and launch.env == {}
    assert launch.command[:5] == ["ray", "job", "submit", "--runtime-env-json", json.dumps({"env_vars": FR})]
    assert launch.command[5:] == ["--no-wait", "--", "python", "d.py"]
    assert any("drop --no-wait" in line for line in launch.lines())
    users = {"pip": ["x"], "env_vars": {"TORCH_FR_DUMP_TEMP_FILE": "/shared/fr/rank_", "A": "1"}}
    for spelled in (["--runtime-env-json", json.dumps(users)], [f"--runtime-env-json={json.dumps(users)}"]):
        launch = plan(["ray", "job", "submit", *spelled, "--", "python", "d.py"], {}, FR, None)
        assert launch is not None and launch.kept == ["TORCH_FR_DUMP_TEMP_FILE"]
        given = launch.command[3].removeprefix("--runtime-env-json=") if len(spelled) == 1 else launch.command[4]
        assert json.loads(given) == {
            "pip": ["x"],
            "env_vars": {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": "/shared/fr/rank_", "A": "1"},
        }
        assert launch.command[-3:] == ["--", "python", "d.py"]


def test_a_submitted_job_gets_an_id_that_kill_can_stop_unless_it_has_one():
    submitted = plan(["ray", "job", "submit", "--address", "http://h:8265", "--", "python", "d.py"], {}, FR, None)
    assert submitted is not None
    launch = with_submission_id(submitted, "mtpdiag-run-1")
    assert (launch.submission_id, launch.job_server, launch.ray_cli) == ("mtpdiag-run-1", "http://h:8265", ["ray"])
    assert launch.command[3:5] == ["--submission-id", "mtpdiag-run-1"]
    assert launch.command[-3:] == ["--", "python", "d.py"] and launch.record()["submission_id"] == "mtpdiag-run-1"
    for spelled in (["--submission-id", "theirs"], ["--submission-id=theirs"]):
        own = plan(["ray", "job", "submit", *spelled, "--", "python", "d.py", "--submission-id", "x"], {}, FR, None)
        assert own is not None
        kept = with_submission_id(own, "mtpdiag-run-2")
        assert (kept.submission_id, kept.job_server, kept.command) == ("theirs", "", own.command)
    module = plan(["python3", "-m", "ray.scripts.scripts", "job", "submit", "--", "python", "d.py"], {}, FR, None)
    assert module is not None
    assert with_submission_id(module, "i").ray_cli == ["python3", "-m", "ray.scripts.scripts"]
    driver = plan(["python", "-m", "verl.trainer.main_ppo"], {}, FR, None)
    assert driver is not None and with_submission_id(driver, "mtpdiag-run-3") == driver  # its end ends its actors


def test_what_cannot_be_merged_is_left_alone_and_said():
    launch = plan(["ray", "job", "submit", "--runtime-env", "env.yaml", "--", "python", "d.py"], {}, FR, None)
    assert launch is not None and launch.route == RayEnvRoute.NOT_APPLIED
    assert launch.command == ["ray", "job", "submit", "--runtime-env", "env.yaml", "--", "python", "d.py"]
    assert "--runtime-env file" in launch.why_not and "TORCH_FR_DUMP_TEMP_FILE" in launch.why_not
    bad = plan(["python", "d.py"], {JOB_CONFIG_ENV: "not json"}, FR, "auto")
    assert bad is not None and bad.route == RayEnvRoute.NOT_APPLIED and bad.env == {}
    assert "NOT given" in bad.lines()[0]


def test_run_gives_a_ray_driver_the_variable_and_records_how(tmp_path):
    """The driver here is a shell that writes what it got; nothing answers at the address, so run waits for the
    cluster, and the job's end ends the run with its exit code."""
    out, seen = tmp_path / "run", tmp_path / "seen"
    done = run_cli(
        "run", "--out", str(out), "--ray", "127.0.0.1:9", "--ray-timeout", "5", "--",
        "sh", "-c", f'printf %s "${JOB_CONFIG_ENV}" > {seen}; exit 3',
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]
    given = json.loads(seen.read_text())["runtime_env"]["env_vars"]
    assert given["TORCH_FR_DUMP_TEMP_FILE"] == str(out / "fr" / "rank_")
    assert given["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == str(out / "fr-pipe" / "rank_")
    record = json.loads((out / "run.json").read_text())["ray"]
    assert record["route"] == "RAY_JOB_CONFIG_JSON_ENV_VAR" and record["address"] == "127.0.0.1:9"
    assert "TORCH_FR_BUFFER_SIZE" in record["actor_env"] and record["detected"] == "--ray"
    assert "through RAY_JOB_CONFIG_JSON_ENV_VAR" in done.stderr
    assert "Traceback" not in done.stderr + (out / "events.log").read_text()


def test_a_job_server_address_is_refused_before_the_job_starts(tmp_path):
    marker = tmp_path / "started"
    done = run_cli("run", "--out", str(tmp_path / "r"), "--ray", "http://127.0.0.1:8265", "--", "touch", str(marker))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "job server" in done.stderr and not marker.exists() and not (tmp_path / "r").exists()

"""One process, two trainers of different precision (a notebook's CPU runs, then its GPU cell): the second is
built, not refused by Accelerate's process-wide state (the GPU notebook record of issue 45 found the refusal)."""
import subprocess
import sys
import textwrap



def test_second_trainer_with_another_precision_in_one_process():
    code = textwrap.dedent("""
        import os
        os.environ.pop("WORLD_SIZE", None)
        from accellib.core.launch import make_accelerator
        for precision in ("fp32", "bf16", "fp32"):   # the state is the process's: read each while it is current
            print(make_accelerator(precision=precision, device="cpu").mixed_precision)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.split() == ["no", "bf16", "no"]


def test_launched_process_keeps_its_state():
    """Under a launch (WORLD_SIZE set) the state is the process group's: a changed precision is still refused."""
    code = textwrap.dedent("""
        import os
        os.environ.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29731")
        from accellib.core.launch import make_accelerator
        make_accelerator(precision="fp32", device="cpu")
        try:
            make_accelerator(precision="bf16", device="cpu")
        except ValueError as e:
            print("refused", "already been initialized" in str(e))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-800:]
    assert r.stdout.split()[-2:] == ["refused", "True"]

"""The loops' shared pieces: when a periodic action is due (`itstime`), and the throughput's pausable timer."""

from electra_jax import scaffold


def test_itstime():
  # Every 3 steps, after the last step (8) and after the steps named (5), nowhere else.
  due = [step for step in range(1, 9) if scaffold.itstime(step, 3, 8, (5,))]
  assert due == [3, 5, 6, 8]
  assert [step for step in range(1, 9) if scaffold.itstime(step, 100, 8)] == [8]


def test_chrono_leaves_the_paused_time_out(monkeypatch):
  now = [100.0]
  monkeypatch.setattr(scaffold.time, 'time', lambda: now[0])
  chrono = scaffold.Chrono()
  now[0] += 2.0  # training
  with chrono.paused():
    now[0] += 5.0  # evaluating
  now[0] += 1.0
  assert chrono.seconds() == 3.0
  chrono.restart()
  now[0] += 0.5
  assert chrono.seconds() == 0.5

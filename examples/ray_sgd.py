"""Data-parallel SGD over 4 Ray actors, gradients averaged with tensorcomm's all_reduce:

    pip install 'tensorcomm[ray]' && python examples/ray_sgd.py

Each actor holds a quarter of a least-squares problem (y = X w + noise); every step it computes
its gradient, averages it with the others (``tc.all_reduce(..., op=AVG)``) and takes the same
step, so the four copies of ``w`` stay identical. Prints the loss every 25 steps and the
distance to the true weights at the end.
"""

import numpy as np
import ray

import tensorcomm as tc
import tensorcomm.ray

WORKERS, FEATURES, ROWS, STEPS, RATE = 4, 8, 256, 100, 0.1


@ray.remote
class Trainer:
    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.true_w = np.random.default_rng(0).normal(size=FEATURES)  # the same on every actor
        self.x = rng.normal(size=(ROWS, FEATURES))
        self.y = self.x @ self.true_w + 0.01 * rng.normal(size=ROWS)
        self.w = np.zeros(FEATURES)

    def train(self, steps: int) -> list:
        losses = []
        for _ in range(steps):
            error = self.x @ self.w - self.y
            grad = self.x.T @ error / ROWS
            tc.all_reduce(grad, op=tc.ReduceOp.AVG)  # the mean gradient of all shards
            self.w -= RATE * grad
            loss = np.array([np.mean(error ** 2)])
            tc.all_reduce(loss, op=tc.ReduceOp.AVG)
            losses.append(float(loss[0]))
        return losses

    def weights(self) -> np.ndarray:
        return self.w

    def distance(self) -> float:
        return float(np.linalg.norm(self.w - self.true_w))


if __name__ == "__main__":
    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False)
    trainers = [Trainer.remote(seed) for seed in range(1, WORKERS + 1)]
    tensorcomm.ray.init_group(trainers, timeout=120)
    losses = ray.get([t.train.remote(STEPS) for t in trainers])
    assert all(run == losses[0] for run in losses), "every actor sees the same averaged loss"
    for step in range(0, STEPS, 25):
        print(f"step {step:3d}: loss {losses[0][step]:.6f}")
    weights = ray.get([t.weights.remote() for t in trainers])
    assert all(np.array_equal(w, weights[0]) for w in weights), "the four copies of w agree"
    print(f"identical weights on {WORKERS} actors; distance to the true weights: "
          f"{ray.get(trainers[0].distance.remote()):.4f}")
    tensorcomm.ray.destroy_group(trainers)
    ray.shutdown()

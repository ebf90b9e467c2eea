"""What a training run tells a person: the non-finite guard, step timing, cost, curves, the
console and the phases of its summary."""

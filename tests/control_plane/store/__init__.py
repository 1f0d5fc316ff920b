"""Tests of the state stores: one contract suite for both, and Redis recovery."""

"""The admin API and scheduling brain (registry, placer, autoscaler, reaper). Not built yet."""

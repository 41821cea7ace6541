"""From audio clips and transcripts to the arrays and manifests the trainer reads (`indextts-train prepare`)."""

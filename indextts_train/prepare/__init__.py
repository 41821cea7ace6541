"""From audio clips and transcripts to the arrays train-gpt reads: audio paths, w2v-BERT, codecs, pipeline."""

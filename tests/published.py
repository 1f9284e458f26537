"""Published parameter totals, typed in by hand from the team's REFERENCE.md ("total params"; no test
reads that file): each Hugging Face transformers 5.23 model built on the meta device, a tied tensor counted once. Kept
apart from archlab/cli/check.py's copy on purpose: the tests check the code against this one."""

PUBLISHED = {
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "gpt2-large": 774_030_080,
    "gpt2-xl": 1_557_611_200,
    "gptj-6b": 6_050_882_784,
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
    "llama-65b": 65_285_660_672,
    "llama2-7b": 6_738_415_616,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
}

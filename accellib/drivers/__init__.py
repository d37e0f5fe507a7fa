"""What builds several Trainers: the V-cycle, the comparison's plan and budgets, the multi-process timing harnesses.

A driver imports core/ and techniques/; nothing below it imports a driver.
"""

"""The driver's process of the fully async recipe: ``FullyAsyncTrainer`` and what it composes
(the batch feed, the served weights and their push, the typed clients of the two actors).

It talks to the rollouter only through ``RolloutClient`` and the shared messages
(fully_async_policy/messages.py); it never imports fully_async_policy/rollouter/.
"""
